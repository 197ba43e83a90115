"""Reading UTF-8 text and JSON files, with errors that name the file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hipgraph.errors import InputError


def read_utf8(path: Path) -> str:
    """The text of a UTF-8 file (a BOM is dropped); InputError with the line of undecodable bytes."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError) as exc:
        raise InputError("file not found", source=str(path)) from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(
            f"undecodable bytes (not UTF-8) at byte {exc.start}: {data[exc.start:exc.start + 4]!r}",
            source=str(path), line=line) from exc


def parse_json(text: str, *, source: str, line: int | None = None) -> Any:
    """``json.loads(text)``; InputError naming ``source`` (and the line) when the text is not
    JSON or nests too deeply for the parser. ``line`` is the line of a JSONL record."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        what = "malformed JSON" if line is None else "malformed JSON line"
        raise InputError(f"{what}: {exc.msg} (column {exc.colno})", source=source,
                         line=exc.lineno if line is None else line) from exc
    except RecursionError as exc:
        raise InputError("JSON nested too deeply to read", source=source, line=line) from exc


def read_json_file(path: str | Path) -> Any:
    """Parse a UTF-8 JSON file; errors name the file (and line) for missing, undecodable,
    malformed or too deeply nested input."""
    path = Path(path)
    return parse_json(read_utf8(path), source=str(path))


def read_jsonl_file(path: str | Path) -> list[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line of a UTF-8 JSONL file. Lines end at
    ``\n`` only: U+2028 and other characters ``str.splitlines`` breaks at may stand raw inside
    a JSON string."""
    path = Path(path)
    return [(n, parse_json(line, source=str(path), line=n))
            for n, line in enumerate(read_utf8(path).split("\n"), start=1) if line.strip()]
