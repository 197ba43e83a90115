"""Validation of input records into :class:`Document` and their content hashes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from hipgraph.errors import InputError
from hipgraph.text.limits import MAX_DOCUMENT_CHARS, check_json_value, check_text, short_repr
from hipgraph.types import Document


class SkippedRecord(Exception):
    """A record that carries no text: skipped with a warning and counted, not fatal."""


def to_document(record: Document | Mapping[str, Any], *, where: str = "record") -> Document:
    """Validate one record (a :class:`Document` or a mapping with id/text/title/metadata).

    Raises :class:`InputError` naming the field for malformed records (also for anything the
    write would fail on: text that is not valid Unicode, a text over :data:`MAX_DOCUMENT_CHARS`,
    metadata nested too deeply) and :class:`SkippedRecord` for records without text.
    """
    if isinstance(record, Document):
        doc = record
    elif isinstance(record, Mapping):
        raw_id = record.get("id")
        if raw_id is None or isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
            raise InputError(f"{where}: field 'id' must be a string or integer, got {short_repr(raw_id)}")
        text = record.get("text")
        title = record.get("title") or ""
        metadata = record.get("metadata") or {}
        if text is not None and not isinstance(text, str):
            raise InputError(f"{where}: field 'text' must be a string, got {type(text).__name__}")
        if not isinstance(title, str):
            raise InputError(f"{where}: field 'title' must be a string, got {type(title).__name__}")
        if not isinstance(metadata, Mapping):
            raise InputError(f"{where}: field 'metadata' must be an object")
        doc = Document(str(raw_id), text or "", title, dict(metadata))
    else:
        raise InputError(f"{where}: expected an object, got {type(record).__name__}")
    if not doc.id.strip():
        raise InputError(f"{where}: field 'id' is empty")
    for field, value in (("id", doc.id), ("title", doc.title), ("text", doc.text)):
        check_text(value, where, field)
    if not doc.text.strip():
        raise SkippedRecord(f"{where}: document {short_repr(doc.id)} has no text")
    if len(doc.text) > MAX_DOCUMENT_CHARS:
        raise InputError(f"{where}: field 'text' is {len(doc.text):,} characters long, over the limit "
                         f"of {MAX_DOCUMENT_CHARS:,} per document; split it into several documents")
    check_json_value(doc.metadata, where, "metadata")
    try:  # as it is written: sorted keys (mixed key types fail), no NaN (DuckDB's JSON has none)
        json.dumps(doc.metadata, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: metadata of {short_repr(doc.id)} is not JSON-serializable: {exc}") from exc
    return doc


def content_hash(doc: Document) -> str:
    """SHA-256 over title, text and metadata: any change makes the document 'replaced'."""
    h = hashlib.sha256()
    h.update(doc.title.encode("utf-8"))
    h.update(b"\x00")
    h.update(doc.text.encode("utf-8"))
    h.update(b"\x00")
    h.update(json.dumps(doc.metadata, sort_keys=True, ensure_ascii=False).encode("utf-8"))
    return h.hexdigest()


def text_hash(title: str, text: str) -> str:
    return hashlib.sha256(f"{title}\n{text}".encode()).hexdigest()
