"""Reading UTF-8 text and JSON files, with errors that name the file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hipgraph.errors import InputError


def read_utf8(path: Path) -> str:
    """The text of a UTF-8 file (a BOM is dropped); InputError with the line of undecodable bytes."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(
            f"undecodable bytes (not UTF-8) at byte {exc.start}: {data[exc.start:exc.start + 4]!r}",
            source=str(path), line=line) from exc


def read_json_file(path: str | Path) -> Any:
    """Parse a UTF-8 JSON file; errors name the file (and line) for missing, undecodable or
    malformed input."""
    path = Path(path)
    try:
        text = read_utf8(path)
    except (FileNotFoundError, IsADirectoryError) as exc:
        raise InputError("file not found", source=str(path)) from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"malformed JSON: {exc.msg} (column {exc.colno})", source=str(path),
                         line=exc.lineno) from exc
