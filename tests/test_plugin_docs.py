"""docs/plugins.md documents every hook with its exact signature (datasette's
test_docs.py pattern): adding, renaming or changing a hook without the docs fails here."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from taskmill import hookspecs
from taskmill.plugins import DISABLE_ENV, ENTRY_POINT_GROUP, HOOK_NAMES
from taskmill.proxy import EX_DATAERR, EX_TEMPFAIL, PROGRESS_PREFIX

DOCS = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def signature_of(name: str) -> str:
    """The hook's signature as the docs must show it: ``def name(arg: Type, ...) -> R``."""
    spec = getattr(hookspecs, name)
    signature = inspect.signature(spec)  # annotations stay the strings of the source
    params = ", ".join(f"{p.name}: {p.annotation}" for p in signature.parameters.values())
    return f"def {name}({params}) -> {signature.return_annotation}"


def documented_signatures() -> dict[str, str]:
    """Every ``def taskmill_...`` line in a code block of the docs, by hook name."""
    text = DOCS.read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    found: dict[str, str] = {}
    for block in blocks:
        for line in block.splitlines():
            match = re.match(r"^(?:async )?def (taskmill_\w+)\(.*", line)
            if match and match.group(1) not in found and line.rstrip().endswith(":"):
                found[match.group(1)] = line.rstrip().removesuffix(":").removeprefix("async ")
    return found


def reference_signatures() -> dict[str, str]:
    """The signature lines of the hook reference section (headed by each hook)."""
    text = DOCS.read_text()
    reference: dict[str, str] = {}
    for name, block in re.findall(
        r"^### `(taskmill_\w+)`\n.*?^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL
    ):
        reference[name] = block.strip()
    return reference


def test_the_hooks_are_the_functions_of_the_hookspecs_module():
    specs = [
        name
        for name, value in vars(hookspecs).items()
        if inspect.isfunction(value) and hasattr(value, f"{hookspecs.PROJECT}_spec")
    ]
    assert list(HOOK_NAMES) == specs
    assert "taskmill_register_handlers" in specs  # the name SPEC section 7 fixes


@pytest.mark.parametrize("name", HOOK_NAMES)
def test_every_hook_has_a_reference_entry_with_its_exact_signature(name: str):
    reference = reference_signatures()
    assert name in reference, f"docs/plugins.md has no '### `{name}`' section"
    assert reference[name] == signature_of(name), (
        f"the signature of {name} in docs/plugins.md differs from taskmill/hookspecs.py"
    )


def test_the_docs_document_no_hook_that_does_not_exist():
    assert set(reference_signatures()) <= set(HOOK_NAMES)
    # Examples may implement hooks with fewer arguments, but only hooks that exist.
    assert set(documented_signatures()) <= set(HOOK_NAMES)


def test_the_docs_name_the_discovery_names_and_the_subprocess_protocol():
    text = DOCS.read_text()
    for fixed in (
        ENTRY_POINT_GROUP,
        DISABLE_ENV,
        "taskmill.hookimpl",
        PROGRESS_PREFIX.strip(),
        f"| {EX_TEMPFAIL} ",
        f"| {EX_DATAERR} ",
        "PluginError",
        "taskmill plugins",
    ):
        assert fixed in text, f"docs/plugins.md does not mention {fixed!r}"
