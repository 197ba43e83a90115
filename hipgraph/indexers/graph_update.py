"""SQL routines that keep the derived graph (edges, surface forms) in step with its provenance.

All functions run inside the caller's transaction and touch only what a batch affected: edges of
affected entities, mention edges of new/deleted passages, synonym edges of new entities.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hipgraph.config import SynonymConfig
from hipgraph.store.database import GraphStore


@dataclass
class Removed:
    """Ids removed in one batch, for the FAISS update after commit."""

    passages: set[int] = field(default_factory=set)
    entities: set[int] = field(default_factory=set)
    facts: set[int] = field(default_factory=set)
    affected_entities: set[int] = field(default_factory=set)
    candidate_facts: set[int] = field(default_factory=set)


def _ids(con, sql: str, params=()) -> set[int]:
    return {int(r[0]) for r in con.execute(sql, list(params)).fetchall()}


def delete_document_rows(store: GraphStore, doc_ids: list[int], removed: Removed) -> None:
    """Delete documents, their passages, mentions, fact sources and passage vectors.

    Orphaned entities/facts are collected later by :func:`collect_orphans`.
    """
    if not doc_ids:
        return
    con = store.con
    with store.temp_ids("_del_docs", doc_ids):
        passages = _ids(con, "SELECT id FROM passages WHERE doc_id IN (SELECT id FROM _del_docs)")
        with store.temp_ids("_del_passages", sorted(passages)):
            removed.affected_entities |= _ids(
                con, "SELECT DISTINCT entity_id FROM mentions WHERE passage_id IN (SELECT id FROM _del_passages)")
            removed.candidate_facts |= _ids(
                con, "SELECT DISTINCT fact_id FROM fact_sources WHERE passage_id IN (SELECT id FROM _del_passages)")
            for table, column in (("mentions", "passage_id"), ("fact_sources", "passage_id"),
                                  ("passage_vectors", "id"), ("passages", "id")):
                con.execute(f"DELETE FROM {table} WHERE {column} IN (SELECT id FROM _del_passages)")
            con.execute("DELETE FROM edges WHERE type = 'mention' AND src IN (SELECT id FROM _del_passages)")
        con.execute("DELETE FROM documents WHERE id IN (SELECT id FROM _del_docs)")
    removed.passages |= passages


def collect_orphans(store: GraphStore, removed: Removed) -> None:
    """Delete facts left without sources and entities left without mentions (and their edges)."""
    con = store.con
    if removed.candidate_facts:
        with store.temp_ids("_cand_facts", sorted(removed.candidate_facts)):
            orphan_facts = _ids(con, """
                SELECT id FROM _cand_facts
                WHERE id NOT IN (SELECT fact_id FROM fact_sources)""")
            if orphan_facts:
                with store.temp_ids("_orphan_facts", sorted(orphan_facts)):
                    removed.affected_entities |= _ids(con, """
                        SELECT subject_id FROM facts WHERE id IN (SELECT id FROM _orphan_facts)
                        UNION SELECT object_id FROM facts WHERE id IN (SELECT id FROM _orphan_facts)""")
                    con.execute("DELETE FROM fact_vectors WHERE id IN (SELECT id FROM _orphan_facts)")
                    con.execute("DELETE FROM facts WHERE id IN (SELECT id FROM _orphan_facts)")
            removed.facts |= orphan_facts
    if removed.affected_entities:
        with store.temp_ids("_aff", sorted(removed.affected_entities)):
            orphans = _ids(con, """
                SELECT id FROM _aff WHERE id NOT IN (SELECT entity_id FROM mentions)
                AND id IN (SELECT id FROM entities)""")
            if orphans:
                with store.temp_ids("_orphan_entities", sorted(orphans)):
                    con.execute("DELETE FROM entity_vectors WHERE id IN (SELECT id FROM _orphan_entities)")
                    con.execute("DELETE FROM entities WHERE id IN (SELECT id FROM _orphan_entities)")
                    con.execute("""
                        DELETE FROM edges WHERE type IN ('fact', 'synonym')
                        AND (src IN (SELECT id FROM _orphan_entities) OR dst IN (SELECT id FROM _orphan_entities))""")
                removed.entities |= orphans


def refresh_entities(store: GraphStore, entity_ids: set[int]) -> None:
    """Recompute fact edges, surface forms and labels of ``entity_ids`` from provenance."""
    if not entity_ids:
        return
    con = store.con
    with store.temp_ids("_refresh", sorted(entity_ids)):
        con.execute("""
            DELETE FROM edges WHERE type = 'fact'
            AND (src IN (SELECT id FROM _refresh) OR dst IN (SELECT id FROM _refresh))""")
        con.execute("""
            INSERT INTO edges (type, src, dst, weight)
            SELECT 'fact', least(f.subject_id, f.object_id), greatest(f.subject_id, f.object_id),
                   count(*)::DOUBLE
            FROM facts f JOIN fact_sources s ON s.fact_id = f.id
            WHERE f.subject_id <> f.object_id
              AND (f.subject_id IN (SELECT id FROM _refresh) OR f.object_id IN (SELECT id FROM _refresh))
            GROUP BY 2, 3""")
        con.execute("""
            UPDATE entities SET surface_forms = agg.forms, label = agg.label
            FROM (
                SELECT entity_id,
                       list(DISTINCT surface ORDER BY surface) AS forms,
                       arg_max(label, cnt ORDER BY cnt, label DESC) FILTER (WHERE label IS NOT NULL) AS label
                FROM (SELECT entity_id, surface, label, count(*) AS cnt FROM mentions
                      WHERE entity_id IN (SELECT id FROM _refresh) GROUP BY ALL)
                GROUP BY entity_id
            ) AS agg
            WHERE entities.id = agg.entity_id""")


def add_mention_edges(store: GraphStore, passage_ids: np.ndarray) -> None:
    if len(passage_ids) == 0:
        return
    with store.temp_ids("_new_passages", passage_ids):
        store.con.execute("""
            INSERT INTO edges (type, src, dst, weight)
            SELECT DISTINCT 'mention', passage_id, entity_id, 1.0 FROM mentions
            WHERE passage_id IN (SELECT id FROM _new_passages)""")


def synonym_pairs(
    new_ids: np.ndarray,
    new_vectors: np.ndarray,
    old_scores: np.ndarray,
    old_ids: np.ndarray,
    config: SynonymConfig,
    exclude: set[int],
) -> dict[tuple[int, int], float]:
    """Synonym edges of new entities: their kNN among old entities (FAISS results given) and
    among each other, cosine >= threshold, at most ``max_neighbors`` per new entity.

    Pure function over arrays; returns ``{(low_id, high_id): cosine}``.
    """
    k = config.max_neighbors
    pairs: dict[tuple[int, int], float] = {}
    n = len(new_ids)
    if n == 0:
        return pairs
    block = 2048
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        sims = new_vectors[lo:hi] @ new_vectors.T  # (b, n)
        for row in range(hi - lo):
            i = lo + row
            sims[row, i] = -np.inf
            cand_scores = np.concatenate([old_scores[i], sims[row]])
            cand_ids = np.concatenate([old_ids[i], new_ids])
            keep = (cand_ids >= 0) & (cand_scores >= config.threshold)
            cand_scores, cand_ids = cand_scores[keep], cand_ids[keep]
            if exclude and len(cand_ids):
                mask = np.fromiter((int(c) not in exclude for c in cand_ids), bool, len(cand_ids))
                cand_scores, cand_ids = cand_scores[mask], cand_ids[mask]
            if len(cand_ids) > k:
                order = np.lexsort((cand_ids, -cand_scores))[:k]
                cand_scores, cand_ids = cand_scores[order], cand_ids[order]
            me = int(new_ids[i])
            for other, score in zip(cand_ids.tolist(), cand_scores.tolist(), strict=True):
                if other == me:
                    continue
                key = (min(me, other), max(me, other))
                pairs[key] = max(pairs.get(key, -1.0), float(score))
    return pairs
