"""Import of extractions the user already has (HippoRAG OpenIE output and similar).

Accepted file shapes: ``{"extractions": [{"idx"|"id", "entities": [...], "triples": [[s, r, o]]}]}``
or a bare list of such records. Records are keyed by document id (``str(idx)`` for bundles). A
document split into several passages gets each entity/triple on the passages whose text mentions
it (case-insensitive), falling back to its first passage.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from hipgraph.config import ExtractorConfig
from hipgraph.errors import InputError
from hipgraph.text.json_files import read_json_file
from hipgraph.types import Chunk, Extraction, Triple

logger = logging.getLogger(__name__)


def load_extractions(path: str | Path) -> dict[str, Extraction]:
    """Read and validate a precomputed-extraction file; errors name the file and record."""
    path = Path(path)
    data = read_json_file(path)
    records = data.get("extractions") if isinstance(data, dict) else data
    if not isinstance(records, list):
        raise InputError('expected a list of records or {"extractions": [...]}', source=str(path))
    out: dict[str, Extraction] = {}
    for n, record in enumerate(records):
        where = f"extractions[{n}]"
        if not isinstance(record, dict):
            raise InputError(f"{where} is not an object", source=str(path))
        key = record.get("id", record.get("idx"))
        if key is None:
            raise InputError(f"{where} has no 'idx' or 'id'", source=str(path))
        entities = record.get("entities", [])
        triples = record.get("triples", [])
        if not isinstance(entities, list) or not all(isinstance(e, str) for e in entities):
            raise InputError(f"{where}.entities must be a list of strings", source=str(path))
        if not isinstance(triples, list):
            raise InputError(f"{where}.triples must be a list", source=str(path))
        good: list[Triple] = []
        for t, triple in enumerate(triples):
            if (not isinstance(triple, list | tuple) or len(triple) != 3
                    or not all(isinstance(x, str) and x.strip() for x in triple)):
                logger.debug("%s: %s.triples[%d] is not 3 strings; dropped", path, where, t)
                continue
            good.append(Triple(*(x.strip() for x in triple)))
        names = [e.strip() for e in entities if e.strip()]
        out[str(key)] = Extraction(tuple(dict.fromkeys(names)), tuple(good))
    return out


class PrecomputedExtractor:
    """Serves extractions from a file; documents it does not cover get none (logged)."""

    def __init__(self, config: ExtractorConfig):
        self.config = config
        self.path = Path(config.precomputed_path or "")
        self.name = f"precomputed:{self.path.name}"
        self._by_doc = load_extractions(self.path)
        self.missing = 0

    def extract(self, chunks: Sequence[Chunk]) -> list[Extraction]:
        by_doc: dict[str, list[int]] = {}
        for i, chunk in enumerate(chunks):
            by_doc.setdefault(chunk.doc_id, []).append(i)
        results: list[Extraction] = [Extraction((), ())] * len(chunks)
        for doc_id, positions in by_doc.items():
            found = self._by_doc.get(doc_id)
            if found is None:
                self.missing += 1
                logger.warning("%s has no extraction for document %r", self.path, doc_id)
                continue
            if len(positions) == 1:
                results[positions[0]] = found
                continue
            results_for = {p: ([], []) for p in positions}
            lowered = {p: chunks[p].text.lower() for p in positions}

            def home(surface: str, _lowered=lowered, _positions=positions) -> list[int]:
                hits = [p for p in _positions if surface.lower() in _lowered[p]]
                return hits or [_positions[0]]

            for entity in found.entities:
                for p in home(entity):
                    results_for[p][0].append(entity)
            for triple in found.triples:
                for p in home(triple.subject):
                    results_for[p][1].append(triple)
            for p, (ents, trips) in results_for.items():
                results[p] = Extraction(tuple(ents), tuple(trips))
        return results
