"""Readers for input files: JSON (list or bundle), JSONL, and folders of .txt/.md files.

Every record carries ``_where`` ("file:line" or "file[index]") so later errors can name it.
Malformed input raises :class:`InputError` with the file and line before anything is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hipgraph.errors import InputError
from hipgraph.text.json_files import read_json_file, read_jsonl_file, read_utf8

TEXT_SUFFIXES = (".txt", ".md")


@dataclass(frozen=True)
class FieldMap:
    """Which input fields hold the id, text and title; the rest of a record becomes metadata."""

    id: str = "id"
    text: str = "text"
    title: str = "title"
    metadata: bool = True


def read_inputs(paths: list[str | Path], fields: FieldMap | None = None) -> Iterator[dict[str, Any]]:
    """Yield document records from each path in order (files are validated one at a time)."""
    fields = fields or FieldMap()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            yield from _read_folder(path)
        elif not path.exists():
            raise InputError("no such file or folder", source=str(path))
        elif path.suffix.lower() == ".jsonl":
            yield from _read_jsonl(path, fields)
        elif path.suffix.lower() == ".json":
            yield from _read_json(path, fields)
        elif path.suffix.lower() in TEXT_SUFFIXES:
            yield _text_file(path, path.parent)
        else:
            raise InputError("unsupported file type (use .json, .jsonl, .txt, .md or a folder)",
                             source=str(path))


def _record(obj: Any, fields: FieldMap, where: str, *, bundle: bool = False) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected an object, got {type(obj).__name__}")
    # bundles' corpus entries are {"idx", "title", "text"}
    raw_id = obj.get("idx", obj.get(fields.id)) if bundle else obj.get(fields.id)
    if raw_id is None:
        raise InputError(f"{where}: missing field {fields.id!r}")
    record = {"id": raw_id, "text": obj.get(fields.text), "title": obj.get(fields.title) or "",
              "_where": where}
    if fields.metadata:
        skip = {fields.id, fields.text, fields.title, "idx"} if bundle else {fields.id, fields.text, fields.title}
        meta = {k: v for k, v in obj.items() if k not in skip}
        if isinstance(obj.get("metadata"), dict):
            meta.pop("metadata")
            meta.update(obj["metadata"])
        record["metadata"] = meta
    return record


def _read_json(path: Path, fields: FieldMap) -> Iterator[dict[str, Any]]:
    data = read_json_file(path)
    bundle = isinstance(data, dict) and "corpus" in data
    if bundle:
        records = data["corpus"]
    elif isinstance(data, list):
        records = data
    else:
        raise InputError('expected a list of records or a bundle with "corpus"', source=str(path))
    if not isinstance(records, list):
        raise InputError('"corpus" must be a list', source=str(path))
    if not records:
        raise InputError("the file holds no records", source=str(path))
    prefix = f"{path}[corpus]" if bundle else str(path)
    # the whole file is read before its first record is indexed
    yield from [_record(obj, fields, f"{prefix}[{i}]", bundle=bundle)
                for i, obj in enumerate(records)]


def _read_jsonl(path: Path, fields: FieldMap) -> Iterator[dict[str, Any]]:
    rows = read_jsonl_file(path)
    if not rows:
        raise InputError("the file holds no records", source=str(path))
    # the whole file is read before its first record is indexed
    yield from [_record(obj, fields, f"{path}:{n}") for n, obj in rows]


def _read_folder(root: Path) -> Iterator[dict[str, Any]]:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    if not files:
        raise InputError(f"the folder holds no {' or '.join(TEXT_SUFFIXES)} files", source=str(root))
    for path in files:
        yield _text_file(path, root)


def _text_file(path: Path, root: Path) -> dict[str, Any]:
    text = read_utf8(path)
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    title = path.stem.replace("_", " ")
    if path.suffix.lower() == ".md":
        for line in text.splitlines():
            if line.startswith("# "):
                title = line[2:].strip()
                break
    return {"id": rel, "text": text, "title": title, "metadata": {"path": rel}, "_where": str(path)}
