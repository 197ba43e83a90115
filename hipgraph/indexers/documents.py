"""Validation of input records into :class:`Document` and their content hashes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from hipgraph.errors import InputError
from hipgraph.types import Document


class SkippedRecord(Exception):
    """A record that carries no text: skipped with a warning and counted, not fatal."""


def to_document(record: Document | Mapping[str, Any], *, where: str = "record") -> Document:
    """Validate one record (a :class:`Document` or a mapping with id/text/title/metadata).

    Raises :class:`InputError` naming the field for malformed records and :class:`SkippedRecord`
    for records without text.
    """
    if isinstance(record, Document):
        doc = record
    elif isinstance(record, Mapping):
        raw_id = record.get("id")
        if raw_id is None or isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
            raise InputError(f"{where}: field 'id' must be a string or integer, got {raw_id!r}")
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
    if not doc.text.strip():
        raise SkippedRecord(f"{where}: document {doc.id!r} has no text")
    try:
        json.dumps(doc.metadata)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: metadata of {doc.id!r} is not JSON-serializable: {exc}") from exc
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
