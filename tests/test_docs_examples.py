"""Every Python example in README.md, docs/*.md and docs/backends/*.md runs, or at least
compiles (the way pytest and datasette test their docs).

A ```python block is one of three kinds:

- a **program** (it calls ``asyncio.run(`` or has ``if __name__``): it runs as a user
  would run it, ``python example.py`` in an empty directory of its own, and must exit 0
  within ``TIMEOUT`` seconds;
- a **fragment** (anything else: a handler, a few calls, a module to import): it is
  compiled, with top-level ``await`` allowed and its common indentation removed, and
  what it imports from taskmill's own distributions is imported, so a syntax error or a
  name the API no longer has fails here;
- **skipped**: an HTML comment ``<!-- docs-test: skip REASON -->``, at the start of a line
  before it (it applies to the next code block), says why; pytest's summary shows it.

Programs get the environment of the test run without its ``TASKMILL_*`` variables (a
``TASKMILL_URL`` of the shell must not move an example's store), except the
``TASKMILL_TEST_*`` server URLs, which an example that reads its URL from the
environment may use.

The plugin example of docs/plugins.md is a package, not a program: it runs in
``test_the_plugin_example_runs_beside_the_readme``, installed with an entry point the
way ``pip install taskmill-photos`` would, together with the README's control example
and the plugin's own test examples.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "backends").glob("*.md")),
]
TIMEOUT = 120.0

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
# A comment of its own, at the start of a line (not one quoted in a code span).
_SKIP = re.compile(r"^[ \t]*<!--\s*docs-test:\s*skip\b(?P<reason>.*?)-->", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class Example:
    """One fenced code block of a page."""

    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    skip: str | None  # the reason of a docs-test skip comment before the block

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def is_python(self) -> bool:
        return self.language in ("python", "py", "python3")

    @property
    def is_program(self) -> bool:
        return "asyncio.run(" in self.code or "if __name__" in self.code

    @property
    def kind(self) -> str:
        if self.skip is not None:
            return "skipped"
        return "program" if self.is_program else "fragment"


def code_blocks(page: Path) -> list[Example]:
    """Every fenced code block of `page`, with the skip comment that precedes it."""
    lines = page.read_text().splitlines()
    blocks: list[Example] = []
    pending_skip: str | None = None
    text_since_block: list[str] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            text_since_block.append(lines[i])
            i += 1
            continue
        skips = list(_SKIP.finditer("\n".join(text_since_block)))
        if skips:
            pending_skip = skips[-1]["reason"].strip() or "(no reason given)"
        text_since_block = []
        indent, fence = opening["indent"], opening["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped.startswith(fence) and stripped.strip(fence[0]) == "":
                break
            body.append(lines[j].removeprefix(indent))
            j += 1
        blocks.append(
            Example(
                page=page,
                line=i + 1,
                language=opening["info"].strip().split(" ")[0].lower(),
                code="\n".join(body) + "\n",
                skip=pending_skip,
            )
        )
        pending_skip = None
        i = j + 1
    return blocks


def python_examples() -> list[Example]:
    return [block for page in PAGES for block in code_blocks(page) if block.is_python]


EXAMPLES = python_examples()


def example_env() -> dict[str, str]:
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("TASKMILL_") or key.startswith("TASKMILL_TEST_")
    }


def run_program(
    code: str, directory: Path, *, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    script = directory / "example.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=directory,
        env=env or example_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def compile_fragment(example: Example) -> None:
    """Compile the fragment, and import what it imports from taskmill's distributions
    (``taskmill``, ``taskmill_http``, ...): a name the docs use that the API no longer
    has fails here."""
    tree = compile(
        textwrap.dedent(example.code),
        example.name,
        "exec",
        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | ast.PyCF_ONLY_AST,
        dont_inherit=True,
    )
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_ours(alias.name):
                    importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and is_ours(node.module):
            assert node.module is not None
            module = importlib.import_module(node.module)
            for alias in node.names:
                if alias.name != "*" and not hasattr(module, alias.name):
                    importlib.import_module(f"{node.module}.{alias.name}")  # a submodule


WORKSPACE_PACKAGES = frozenset(
    {
        "taskmill",
        "taskmill_demo",
        "taskmill_http",
        "taskmill_mongo",
        "taskmill_mysql",
        "taskmill_otel",
        "taskmill_postgres",
        "taskmill_prometheus",
    }
)


def is_ours(module: str | None) -> bool:
    """A module of this workspace's distributions (not an example's own, such as the
    plugin `taskmill_photos` that docs/plugins.md writes)."""
    return (module or "").partition(".")[0] in WORKSPACE_PACKAGES


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_the_example_runs_or_compiles(example: Example, tmp_path: Path) -> None:
    if example.skip is not None:
        pytest.skip(f"{example.name}: {example.skip}")
    if not example.is_program:
        compile_fragment(example)
        return
    done = run_program(example.code, tmp_path)
    assert done.returncode == 0, (
        f"{example.name} exited with status {done.returncode}\n"
        f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    )


def test_the_pages_have_examples_of_every_kind() -> None:
    """The collection itself works: a parser that found nothing would pass everything."""
    kinds = {example.kind for example in EXAMPLES}
    assert {"program", "fragment", "skipped"} <= kinds
    programs = [e.name for e in EXAMPLES if e.kind == "program"]
    assert "README.md" in {name.partition(":")[0] for name in programs}


def test_every_skip_comment_names_its_reason_and_precedes_a_python_block() -> None:
    for page in PAGES:
        text = page.read_text()
        comments = len(_SKIP.findall(text))
        skipped = [block for block in code_blocks(page) if block.skip is not None]
        assert len(skipped) == comments, f"{page}: a docs-test comment precedes no code block"
        for block in skipped:
            assert block.is_python, f"{block.name}: a docs-test skip before a non-Python block"
            assert block.skip != "(no reason given)", f"{block.name}: say why it is skipped"


def block_starting_with(page: str, first_line: str) -> str:
    for block in code_blocks(ROOT / page):
        if block.code.startswith(first_line):
            return block.code
    raise AssertionError(f"{page} has no code block starting with {first_line!r}")


def install_the_plugin_example(site: Path) -> None:
    """docs/plugins.md's taskmill-photos, as `pip install taskmill-photos` would leave it:
    the package and its distribution's metadata with the entry point."""
    package = site / "taskmill_photos"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        block_starting_with("docs/plugins.md", "# src/taskmill_photos/__init__.py")
    )
    dist_info = site / "taskmill_photos-1.0.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: taskmill-photos\nVersion: 1.0.0\n"
    )
    (dist_info / "entry_points.txt").write_text("[taskmill.plugins]\nphotos = taskmill_photos\n")


def test_the_plugin_example_runs_beside_the_readme(tmp_path: Path) -> None:
    """A user who follows README.md and docs/plugins.md: the photos plugin installed, the
    README's control example (which runs `thumbnail` children of its app `photos` with
    its own handler) and the plugin's two test examples all pass."""
    site = tmp_path / "site-packages"
    install_the_plugin_example(site)
    env = example_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])

    control = block_starting_with(
        "README.md", "import asyncio\n\nfrom taskmill import CancelReason"
    )
    app = tmp_path / "app"
    app.mkdir()
    done = run_program(control, app, env=env)
    assert done.returncode == 0, f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    # The README's own handler made the child, not the plugin's (KeyError: 'image').
    assert "photos thumbnail c.png" in done.stdout.splitlines(), done.stdout + done.stderr

    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_photos.py").write_text(
        block_starting_with("docs/plugins.md", "# tests/test_photos.py")
    )
    (tests / "test_entry_point.py").write_text(
        block_starting_with(
            "docs/plugins.md",
            "from taskmill import Taskmill\n\n\ndef test_the_entry_point_registers_the_handlers",
        )
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_mode=auto",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            str(tests),
        ],
        cwd=tests,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert "2 passed" in done.stdout
