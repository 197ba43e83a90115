"""Lenient parsing of an LLM's JSON reply (fences, surrounding prose, trailing commas, quotes).

Shared by every step that asks a chat model for JSON: extraction and segmentation when indexing,
fact filtering, decomposition, expansion and answering when querying.
"""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\r?\n?(.*?)```", re.DOTALL)
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}
_CLOSERS = {"[": "]", "{": "}"}
_MAX_CANDIDATES = 64  # bracket positions tried when digging JSON out of prose


def parse_json_reply(text: str) -> Any:
    """Parse an LLM's JSON reply, repairing common faults; raise ``ValueError`` if hopeless.

    Repairs: Markdown code fences, prose before/after the JSON value (the longest embedded
    object or array wins), trailing commas, single-quoted strings, Python ``True/False/None``.
    """
    if not isinstance(text, str):
        raise ValueError(f"reply is a {type(text).__name__}, not text")
    stripped = text.strip()
    if not stripped:
        raise ValueError("reply is empty")
    try:
        return json.loads(stripped, strict=False)
    except RecursionError as exc:
        raise ValueError("the reply nests too deeply to read") from exc
    except ValueError:
        pass
    sources = [m.group(1).strip() for m in _FENCE.finditer(stripped)]
    sources.append(stripped)
    for source in sources:
        found, value = _parse_lenient(source)
        if found:
            return value
    raise ValueError("no JSON object or array found in the reply")


def _loads(text: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(text, strict=False)
    except (ValueError, RecursionError):  # a value nested past the parser's depth is no answer
        return False, None


def _parse_lenient(source: str) -> tuple[bool, Any]:
    if not source:
        return False, None
    for attempt in (source, _scan(source, 0, whole=True)[1]):
        ok, value = _loads(attempt)
        if ok:
            return True, value
    best: tuple[int, Any] | None = None
    covered_until = -1
    starts = [i for i, ch in enumerate(source) if ch in "[{"][:_MAX_CANDIDATES]
    for start in starts:
        if start < covered_until:  # inside a value already parsed: can only be shorter
            continue
        end, normalized = _scan(source, start, whole=False)
        if end is None:
            continue
        for attempt in (source[start:end], normalized):
            ok, value = _loads(attempt)
            if ok:
                if best is None or end - start > best[0]:
                    best = (end - start, value)
                covered_until = end
                break
    return (True, best[1]) if best is not None else (False, None)


def _scan(s: str, start: int, *, whole: bool) -> tuple[int | None, str]:
    """Normalize JSON-ish text from ``start``; return (end, text).

    With ``whole=False`` scanning stops after the bracketed value opened at ``start`` (end is
    None if it never closes or brackets mismatch); with ``whole=True`` the whole string is read.
    """
    out: list[str] = []
    stack: list[str] = []
    prev = ""  # last significant character outside strings
    i, n = start, len(s)
    while i < n:
        ch = s[i]
        if ch == '"':
            j = _double_string_end(s, i)
            if j is None:
                return (n, "".join(out) + s[i:]) if whole else (None, "")
            out.append(s[i:j])
            prev, i = '"', j
            continue
        if ch == "'" and prev in ("", "[", "{", ",", ":"):
            j, body = _single_string(s, i)
            if j is None:
                return (n, "".join(out) + s[i:]) if whole else (None, "")
            out.append(body)
            prev, i = '"', j
            continue
        if ch in "[{":
            stack.append(ch)
        elif ch in "]}":
            if not stack or _CLOSERS[stack.pop()] != ch:
                if not whole:
                    return None, ""
                stack.clear()
        elif ch == ",":
            k = i + 1
            while k < n and s[k].isspace():
                k += 1
            if k < n and s[k] in "]}":  # trailing comma
                i += 1
                continue
        elif ch.isalpha() or ch == "_":
            j = i
            while j < n and (s[j].isalnum() or s[j] == "_"):
                j += 1
            word = s[i:j]
            out.append(_PY_LITERALS.get(word, word))
            prev, i = word[-1], j
            continue
        out.append(ch)
        if not ch.isspace():
            prev = ch
        i += 1
        if not whole and not stack:
            return i, "".join(out)
    return (n, "".join(out)) if whole else (None, "")


def _double_string_end(s: str, i: int) -> int | None:
    j, n = i + 1, len(s)
    while j < n:
        if s[j] == "\\":
            j += 2
            continue
        if s[j] == '"':
            return j + 1
        j += 1
    return None


def _single_string(s: str, i: int) -> tuple[int | None, str]:
    """A single-quoted string at ``i`` as a JSON string literal; a quote that is not followed by
    ``, : ] }`` (or the end) is taken as an apostrophe inside the string."""
    body: list[str] = []
    j, n = i + 1, len(s)
    while j < n:
        ch = s[j]
        if ch == "\\" and j + 1 < n:
            nxt = s[j + 1]
            body.append("'" if nxt == "'" else ch + nxt)
            j += 2
            continue
        if ch == "'":
            k = j + 1
            while k < n and s[k].isspace():
                k += 1
            if k >= n or s[k] in ",:]}":
                return j + 1, '"' + "".join(body) + '"'
            body.append("'")
        elif ch == '"':
            body.append('\\"')
        else:
            body.append(ch)
        j += 1
    return None, ""
