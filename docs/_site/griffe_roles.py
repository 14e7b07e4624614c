"""A griffe extension for the site's API reference (mkdocs.yml, mkdocstrings' python handler).

taskmill's docstrings cross-reference with Sphinx roles (``:class:`~taskmill.Task```,
``:meth:`open```), which Markdown would print as they are. This turns each into a code
span that links to the object's entry in the reference when the site has one:
``:class:`~taskmill.Task``` reads ``Task``, ``:mod:`taskmill.lifecycle``` reads
``taskmill.lifecycle``, and a name without a module is looked up from the object whose
docstring names it, as Sphinx does. The links are autorefs' optional references: one to
an object that the reference does not show (a private module, the standard library)
stays plain code, without a warning.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

_ROLE = re.compile(
    r":(?:py:)?(?P<role>class|func|meth|mod|attr|data|exc|obj|const|type):`(?P<target>[^`]+)`"
)


def resolve(obj: griffe.Object, name: str) -> str | None:
    """The full path of `name` as named from `obj`'s docstring, or None when unknown."""
    if name.startswith("taskmill"):
        return name
    first, dot, rest = name.partition(".")
    scope: griffe.Object | None = obj
    while scope is not None:
        try:
            found = scope.resolve(first)
        except (griffe.NameResolutionError, griffe.AliasResolutionError):
            scope = scope.parent
            continue
        return found + dot + rest
    return None


def canonical(collection: griffe.ModulesCollection, path: str) -> str:
    """`path`, or the path of the object it is an alias of."""
    try:
        target = collection.get_member(path)
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return path
    try:
        return str(target.final_target.path) if target.is_alias else str(target.path)
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return path


def rewrite(docstring: str, obj: griffe.Object, collection: griffe.ModulesCollection) -> str:
    """`docstring` with its Sphinx roles as Markdown (see the module's doc)."""

    def replace(match: re.Match[str]) -> str:
        target = match["target"].strip()
        explicit = re.fullmatch(r"(?P<title>.*?)\s*<(?P<path>[^>]+)>", target)
        if explicit:
            title, target = explicit["title"], explicit["path"]
        else:
            short = target.startswith("~")
            target = target.lstrip("~!")
            title = target.rsplit(".", 1)[-1] if short else target
        name = target.removesuffix("()")
        path = resolve(obj, name.lstrip("."))
        code = f"<code>{html.escape(title)}</code>"
        if path is None:
            return code
        identifier = html.escape(canonical(collection, path), quote=True)
        return f'<autoref identifier="{identifier}" optional>{code}</autoref>'

    return _ROLE.sub(replace, docstring)


class SphinxRoles(griffe.Extension):
    """Rewrites the Sphinx roles of every docstring of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        collection = loader.modules_collection
        pending: list[griffe.Object] = [pkg]
        while pending:
            obj = pending.pop()
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj.docstring.value, obj, collection)
            pending.extend(
                member for member in obj.members.values() if isinstance(member, griffe.Object)
            )
