"""The traceback excerpt an attempt keeps when its handler raised.

A failed attempt's error is the exception's ``Type: message``; when the handler raised
an unexpected exception, the innermost frames of the handler's own code follow it, so
``taskmill show``, the attempt log and the dashboard say where it failed without the
worker's log. taskmill's own frames (the worker, the context, the thread that runs a
sync handler) are left out, and the excerpt is bounded.
"""

from __future__ import annotations

import os
import traceback
from types import TracebackType

__all__ = ["EXCERPT_FRAMES", "EXCERPT_LIMIT", "excerpt"]

EXCERPT_FRAMES = 8
"""The innermost frames an excerpt keeps."""

EXCERPT_LIMIT = 2000
"""The longest excerpt, in characters (its innermost end is kept)."""

_HEADER = "Traceback (most recent call last):\n"
_OWN = (
    os.path.dirname(__file__) + os.sep,
    os.path.dirname(traceback.__file__) + os.sep + "asyncio" + os.sep,
    os.path.dirname(traceback.__file__) + os.sep + "concurrent" + os.sep,
    os.path.dirname(traceback.__file__) + os.sep + "threading.py",
)


def excerpt(exc: BaseException) -> str | None:
    """The innermost frames of ``exc``'s traceback outside taskmill and asyncio, as
    Python prints them, at most :data:`EXCERPT_FRAMES` frames and :data:`EXCERPT_LIMIT`
    characters; None when no such frame exists."""
    frames = [f for f in traceback.extract_tb(_traceback(exc)) if not f.filename.startswith(_OWN)]
    if not frames:
        return None
    text = _HEADER + "".join(traceback.format_list(frames[-EXCERPT_FRAMES:])).rstrip("\n")
    if len(text) > EXCERPT_LIMIT:
        text = _HEADER + "  ...\n" + text[-(EXCERPT_LIMIT - len(_HEADER) - 6) :]
    return text


def _traceback(exc: BaseException) -> TracebackType | None:
    return exc.__traceback__
