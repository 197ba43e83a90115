"""Writing facts learned at query time (dynamic KG expansion's ``persist=True``) into an index.

Facts arrive as names (subject, relation, object) with the passages that support them. One
transaction adds what is missing - entities for new names (with vectors and synonym edges), the
facts with their embeddings, provenance rows naming the ``extractor``, and a mention (plus mention
edge) of each end in its supporting passages - refreshes the touched entities' derived rows and
bumps the index generation, so snapshots and caches are rebuilt on the next query. FAISS is
updated after the commit, as in batch indexing. A fact already stored is not written again.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from hipgraph.config import IndexConfig
from hipgraph.indexers.graph_update import (
    Removed,
    insert_mentions,
    refresh_entities,
    update_synonyms,
)
from hipgraph.models.base import Embedder
from hipgraph.store.database import GraphStore
from hipgraph.store.reads import fact_ids_by_key
from hipgraph.store.vector_set import VectorSet
from hipgraph.text.facts import fact_text
from hipgraph.text.normalize import clean_surface
from hipgraph.types import LearnedFact

logger = logging.getLogger(__name__)

Key = tuple[str, str, str]


@dataclass
class PersistReport:
    """Ids assigned by :func:`persist_facts`: every fact's id (new or already stored), every
    name's entity id, the keys actually written and the number of new entities."""

    fact_ids: dict[Key, int] = field(default_factory=dict)
    entity_ids: dict[str, int] = field(default_factory=dict)
    written: set[Key] = field(default_factory=set)
    new_entities: int = 0


def persist_facts(store: GraphStore, vectors: VectorSet, embedder: Embedder,
                  facts: Sequence[LearnedFact], extractor: str) -> PersistReport:
    """Store ``facts`` (see module docstring) and return the ids they got."""
    report = PersistReport()
    facts = [f for f in facts if f.passage_ids]
    if not facts:
        return report
    with store.writing(), store.transaction():
        names = sorted({n for f in facts for n in (f.subject, f.object)})
        ids = {name: int(i) for i, name in store.con.execute(
            "SELECT id, name FROM entities WHERE name IN (SELECT unnest(?::VARCHAR[]))", [names]).fetchall()}
        new_names = [n for n in names if n not in ids]
        # stored meanwhile (same batch, earlier call)
        existing = fact_ids_by_key(store, [(ids[f.subject], f.relation, ids[f.object]) for f in facts
                                           if f.subject in ids and f.object in ids])
        vecs = embedder.embed([fact_text(*f.key) for f in facts] + new_names)
        fvecs, nvecs = vecs[: len(facts)], vecs[len(facts):]
        new_ids = store.allocate_ids("entity", len(new_names))
        ids.update(zip(new_names, new_ids.tolist(), strict=True))
        store.insert("entities", {
            "id": new_ids, "name": pa.array(new_names, pa.string()),
            "label": pa.array([None] * len(new_names), pa.string()),
            "surface_forms": pa.array([[] for _ in new_names], pa.list_(pa.string()))})
        store.write_vectors("entity", new_ids, nvecs)
        store.changes.touch_entities(new_ids)
        store.changes.touch_labels(new_ids)
        write = [(f, v) for f, v in zip(facts, fvecs, strict=True)
                 if (ids[f.subject], f.relation, ids[f.object]) not in existing]
        fact_ids = store.allocate_ids("fact", len(write))
        store.insert("facts", {
            "id": fact_ids,
            "subject_id": pa.array([ids[f.subject] for f, _ in write], pa.int64()),
            "relation": pa.array([f.relation for f, _ in write], pa.string()),
            "object_id": pa.array([ids[f.object] for f, _ in write], pa.int64()),
            "kind": pa.array(["triple"] * len(write), pa.string())})
        wvecs = np.array([v for _, v in write], np.float32).reshape(len(write), vectors.dimension)
        store.write_vectors("fact", fact_ids, wvecs)
        store.changes.touch_facts(fact_ids)
        assigned = {f.key: int(i) for (f, _), i in zip(write, fact_ids.tolist(), strict=True)}
        for f in facts:
            assigned.setdefault(f.key, existing.get((ids[f.subject], f.relation, ids[f.object]), -1))
        store.insert("fact_sources", {
            "fact_id": pa.array([assigned[f.key] for f, _ in write for _ in f.passage_ids], pa.int64()),
            "passage_id": pa.array([p for f, _ in write for p in f.passage_ids], pa.int64()),
            "extractor": pa.array([extractor] * sum(len(f.passage_ids) for f, _ in write), pa.string())})
        _add_mentions(store, [f for f, _ in write], ids)
        refresh_entities(store, {ids[n] for f, _ in write for n in (f.subject, f.object)})
        # only the synonyms part: the saved embedder alone may lack its session-only endpoint
        synonyms = IndexConfig.from_dict({"synonyms": store.meta_get("config")["synonyms"]}).synonyms
        update_synonyms(store, vectors.indexes["entity"], new_ids, nvecs,
                        np.zeros(0, np.int64), np.zeros((0, vectors.dimension), np.float32), synonyms)
        store.changes.itemised = True  # mention edges: their entities are refreshed (touched) above
        store.bump_generation()
        store.on_commit(lambda: vectors.apply(Removed(), added={"entity": (new_ids, nvecs),
                                                                "fact": (fact_ids, wvecs)}))
    logger.info("persisted %d learned fact(s), %d new entities (%s)", len(write), len(new_names), extractor)
    report.fact_ids, report.entity_ids = assigned, ids
    report.written = {f.key for f, _ in write}
    report.new_entities = len(new_names)
    return report


def _add_mentions(store: GraphStore, facts: Sequence[LearnedFact], ids: dict[str, int]) -> None:
    """A mention (and mention edge) of each end of a new fact in its supporting passages where
    the passage does not mention that entity yet; the surface is the name as the passage writes it."""
    pairs = {(p, ids[n]): n for f in facts for p in f.passage_ids for n in (f.subject, f.object)}
    if not pairs:
        return
    passages = sorted({p for p, _ in pairs})
    have = {(int(p), int(e)) for p, e in store.con.execute(
        "SELECT DISTINCT passage_id, entity_id FROM mentions WHERE passage_id IN "
        "(SELECT unnest(?::BIGINT[]))", [passages]).fetchall()}
    add = sorted(k for k in pairs if k not in have)
    if not add:
        return
    text = {int(i): x for i, x in store.con.execute(
        "SELECT id, text FROM passages WHERE id IN (SELECT unnest(?::BIGINT[]))", [passages]).fetchall()}
    surfaces = []
    for p, e in add:
        name = pairs[(p, e)]
        found = re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text.get(p, ""), re.IGNORECASE)
        surfaces.append(clean_surface(found.group(0)) if found else name)
    insert_mentions(store, [p for p, _ in add], [e for _, e in add], surfaces, [None] * len(add))
    store.insert("edges", {
        "type": pa.array(["mention"] * len(add), pa.string()),
        "src": pa.array([p for p, _ in add], pa.int64()),
        "dst": pa.array([e for _, e in add], pa.int64()),
        "weight": pa.array([1.0] * len(add), pa.float64())})
