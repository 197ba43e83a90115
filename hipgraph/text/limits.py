"""The size and shape limits input is checked against before anything is written.

A file is checked whole by its reader, so a record that the write pass could not store (a lone
surrogate, metadata nested past :data:`MAX_METADATA_DEPTH`, a text past
:data:`MAX_DOCUMENT_CHARS`) refuses the file before its first batch is committed. Long texts are
never refused for lacking spaces: chunking counts a run of word characters longer than
:data:`MAX_TOKEN_CHARS` as several tokens, and the spaCy extractor parses a text longer than
:data:`MAX_PARSE_CHARS` in pieces.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any

from hipgraph.errors import InputError

MAX_DOCUMENT_CHARS = 10_000_000  # one document's text; split larger files
MAX_TOKEN_CHARS = 32  # a longer run of word characters counts as several chunking tokens
MAX_PARSE_CHARS = 100_000  # longest text handed to spaCy at once (spaCy's own cap is 1,000,000)
MAX_METADATA_DEPTH = 64  # nesting of objects and lists inside a record's metadata

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 40
_SHORT.maxlist = _SHORT.maxdict = _SHORT.maxtuple = _SHORT.maxset = 4
_SHORT.maxlevel = 3
_SHORT_CHARS = 100


def short_repr(value: Any) -> str:
    """A ``repr`` of at most 100 characters for error messages (safe for huge or deeply nested
    values)."""
    text = _SHORT.repr(value)
    return text if len(text) <= _SHORT_CHARS else text[:_SHORT_CHARS - 3] + "..."


def unicode_fault(text: str) -> str | None:
    """Why ``text`` cannot be stored as UTF-8 (a lone surrogate and where), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"holds a lone surrogate {text[exc.start]!r} at character {exc.start}, which UTF-8 "
                "cannot store")
    return None


def check_text(text: str, where: str, field: str) -> None:
    """InputError naming ``where`` and ``field`` when ``text`` cannot be stored as UTF-8."""
    fault = unicode_fault(text)
    if fault:
        raise InputError(f"{where}: field {field!r} {fault}")


def check_json_value(value: Any, where: str, field: str) -> None:
    """InputError when ``value`` nests deeper than :data:`MAX_METADATA_DEPTH` or holds a key or
    string that is not valid Unicode (iterative: no recursion limit is involved)."""
    stack: list[tuple[Any, int, str]] = [(value, 1, field)]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            check_text(item, where, path)
            continue
        if not isinstance(item, Mapping | list | tuple):
            continue
        if depth > MAX_METADATA_DEPTH:
            raise InputError(f"{where}: field {field!r} is nested deeper than {MAX_METADATA_DEPTH} levels")
        if isinstance(item, Mapping):
            for key, sub in item.items():
                if isinstance(key, str):
                    check_text(key, where, f"{path} key")
                stack.append((sub, depth + 1, f"{path}.{key[:40]}" if isinstance(key, str) else path))
        else:
            stack.extend((sub, depth + 1, f"{path}[{i}]") for i, sub in enumerate(item))
