"""MkDocs hooks for the taskmill site (mkdocs.yml `hooks:`).

The markdown files stay written for reading on disk and on a forge: their links are
relative paths in the repository (`docs/cli.md` from README.md, `../bench/README.md` from
a page of docs/). This module publishes the few files outside docs/ that the site needs
and rewrites those links for it:

- README.md becomes the home page (`index.md`), and the benchmark notes of bench/ and the
  throughput plot are published under `bench/`, at the paths listed in `PUBLISHED`;
- a link from any page to a file of the repository that is published (a page of docs/
  or one of `PUBLISHED`) points at it on the site, its `#anchor` kept;
- a link to a file of the repository that is not published (a test, a module of the
  source) becomes the file's path as code (`[`reports.py`](../tests/embedding_apps/reports.py)`
  reads `tests/embedding_apps/reports.py`), or its text followed by the path when the text
  is not the file's name: the site has nothing to link to;
- a link to a file that does not exist is left alone, so that `mkdocs build --strict`
  reports it.

Links in code blocks and code spans are left as they are.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

REPO = Path(__file__).resolve().parents[2]
DOCS_DIR = "docs"

# Repository path -> the path on the site (relative to the site's root, as docs/ is).
PUBLISHED: dict[str, str] = {
    "README.md": "index.md",
    "bench/README.md": "bench/index.md",
    "bench/results/mysql.md": "bench/results/mysql.md",
    "bench/results/finish-batch-scaling.md": "bench/results/finish-batch-scaling.md",
    "bench/results/http-service.md": "bench/results/http-service.md",
    "bench/results/throughput-vs-concurrency.png": "bench/results/throughput-vs-concurrency.png",
}

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
# A code span (left alone) or an inline link or image (rewritten), whichever starts first.
_SPAN_OR_LINK = re.compile(
    r"(?P<code>(?P<ticks>`+)(?:(?!(?P=ticks)).)+?(?P=ticks))"
    r"|(?P<link>(?P<bang>!?)\[(?P<text>(?:[^\[\]]|\[[^\[\]]*\])*)\]"
    r"\((?P<target>[^()\s]+)(?P<title>\s+\"[^\"]*\")?\))",
    re.DOTALL,
)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def repo_path_of(file: File) -> str:
    """The path in the repository of a page or file of the site."""
    for repo_path, site_path in PUBLISHED.items():
        if file.src_uri == site_path:
            return repo_path
    return f"{DOCS_DIR}/{file.src_uri}"


def site_path_of(repo_path: str) -> str | None:
    """Where a file of the repository is on the site, or None when it is not published."""
    if repo_path in PUBLISHED:
        return PUBLISHED[repo_path]
    if repo_path.startswith(f"{DOCS_DIR}/"):
        return repo_path.removeprefix(f"{DOCS_DIR}/")
    return None


def rewrite_target(target: str, page_repo_path: str, page_site_path: str) -> str | None:
    """The link's target on the site; None when the link should become plain text; the
    target unchanged when it is not a relative link or names no file of the repository."""
    if _SCHEME.match(target) or target.startswith(("#", "/")):
        return target
    path, hash_sign, anchor = target.partition("#")
    linked = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), path))
    if linked.startswith("../") or not (REPO / linked).exists():
        return target  # broken: mkdocs reports it
    site_path = site_path_of(linked)
    if site_path is None:
        return None
    relative = posixpath.relpath(site_path, posixpath.dirname(page_site_path) or ".")
    return relative + hash_sign + anchor


def rewrite_links(markdown: str, page_repo_path: str, page_site_path: str) -> str:
    """`markdown` with its relative links pointed at the site (see the module's doc)."""

    def replace(match: re.Match[str]) -> str:
        if match["link"] is None:
            return match[0]
        target = match["target"]
        new = rewrite_target(target, page_repo_path, page_site_path)
        if new is None:
            linked = posixpath.normpath(
                posixpath.join(posixpath.dirname(page_repo_path), target.partition("#")[0])
            )
            if linked.endswith(match["text"].strip("`")):
                return f"`{linked}`"  # the text named the file: the path says more
            return f"{match['text']} (`{linked}`)"
        if new == target:
            return match[0]
        return f"{match['bang']}[{match['text']}]({new}{match['title'] or ''})"

    out: list[str] = []
    chunk: list[str] = []
    fence: str | None = None
    for line in markdown.splitlines(keepends=True):
        opening = _FENCE.match(line)
        if fence is None and opening:
            out.append(_SPAN_OR_LINK.sub(replace, "".join(chunk)))
            chunk = []
            fence = opening.group(1)
            out.append(line)
        elif fence is not None:
            out.append(line)
            closing = line.strip()
            if closing.startswith(fence) and closing.strip(fence[0]) == "":
                fence = None
        else:
            chunk.append(line)
    out.append(_SPAN_OR_LINK.sub(replace, "".join(chunk)))
    return "".join(out)


def on_files(files: Files, *, config: MkDocsConfig) -> Files:
    for repo_path, site_path in PUBLISHED.items():
        source = REPO / repo_path
        if source.exists() and files.get_file_from_path(site_path) is None:
            files.append(File.generated(config, site_path, abs_src_path=str(source)))
    return files


def on_page_markdown(markdown: str, *, page: Page, config: MkDocsConfig, files: Files) -> str:
    return rewrite_links(markdown, repo_path_of(page.file), page.file.src_uri)
