"""SQL routines that keep the derived graph (edges, surface forms) in step with its provenance.

All functions run inside the caller's transaction and touch only what a batch affected: edges of
affected entities, mention edges of new/deleted passages, synonym edges of new entities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from hipgraph.config import SynonymConfig
from hipgraph.store.database import GraphStore
from hipgraph.store.vectors import FLOAT_CANDIDATE_MARGIN, FaissVectorIndex


@dataclass
class Removed:
    """Ids removed in one batch, for the FAISS update after commit."""

    passages: set[int] = field(default_factory=set)
    entities: set[int] = field(default_factory=set)
    facts: set[int] = field(default_factory=set)
    affected_entities: set[int] = field(default_factory=set)
    entity_vector_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    entity_vectors: np.ndarray | None = None
    candidate_facts: set[int] = field(default_factory=set)


def _ids(con, sql: str, params=()) -> set[int]:
    return {int(r[0]) for r in con.execute(sql, list(params)).fetchall()}


def delete_document_rows(store: GraphStore, doc_ids: list[int], removed: Removed) -> None:
    """Delete documents, their passages, mentions, fact sources, passage and turn vectors.

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
            _count_surfaces(store, "SELECT entity_id, surface, label FROM mentions "
                                   "WHERE passage_id IN (SELECT id FROM _del_passages)", sign=-1)
            for table, column in (("mentions", "passage_id"), ("fact_sources", "passage_id"),
                                  ("passage_vectors", "id"), ("turn_vectors", "passage_id"),
                                  ("passages", "id")):
                con.execute(f"DELETE FROM {table} WHERE {column} IN (SELECT id FROM _del_passages)")
            con.execute("DELETE FROM edges WHERE type = 'mention' AND src IN (SELECT id FROM _del_passages)")
        con.execute("DELETE FROM documents WHERE id IN (SELECT id FROM _del_docs)")
    removed.passages |= passages
    store.changes.remove_passages(passages)


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
            store.changes.touch_facts(orphan_facts)
    if removed.affected_entities:
        with store.temp_ids("_aff", sorted(removed.affected_entities)):
            orphans = _ids(con, """
                SELECT id FROM _aff WHERE id NOT IN (SELECT entity_id FROM mentions)
                AND id IN (SELECT id FROM entities)""")
            if orphans:
                ids, vecs = store.read_vectors("entity", np.asarray(sorted(orphans), dtype=np.int64))
                removed.entity_vector_ids = np.concatenate([removed.entity_vector_ids, ids])
                removed.entity_vectors = vecs if removed.entity_vectors is None else np.vstack(
                    [removed.entity_vectors, vecs])
                with store.temp_ids("_orphan_entities", sorted(orphans)):
                    con.execute("DELETE FROM entity_vectors WHERE id IN (SELECT id FROM _orphan_entities)")
                    con.execute("DELETE FROM entities WHERE id IN (SELECT id FROM _orphan_entities)")
                    con.execute("""
                        DELETE FROM edges WHERE type IN ('fact', 'synonym')
                        AND (src IN (SELECT id FROM _orphan_entities) OR dst IN (SELECT id FROM _orphan_entities))""")
                removed.entities |= orphans
                store.changes.remove_entities(orphans)


def refresh_entities(store: GraphStore, entity_ids: set[int]) -> None:
    """Recompute fact edges, surface forms and labels of ``entity_ids`` from provenance."""
    if not entity_ids:
        return
    store.changes.touch_entities(entity_ids)
    with store.temp_ids("_refresh", sorted(entity_ids)):
        store.con.execute("""
            DELETE FROM edges WHERE type = 'fact'
            AND (src IN (SELECT id FROM _refresh) OR dst IN (SELECT id FROM _refresh))""")
        store.con.execute("""
            INSERT INTO edges (type, src, dst, weight)
            SELECT 'fact', least(f.subject_id, f.object_id), greatest(f.subject_id, f.object_id),
                   count(*)::DOUBLE
            FROM facts f JOIN fact_sources s ON s.fact_id = f.id
            WHERE f.subject_id <> f.object_id
              AND (f.subject_id IN (SELECT id FROM _refresh) OR f.object_id IN (SELECT id FROM _refresh))
            GROUP BY 2, 3""")
    refresh_surface_forms(store, entity_ids)


def insert_mentions(store: GraphStore, passage_ids, entity_ids, surfaces, labels) -> None:
    """Append mention rows (equal-length sequences; a label may be None) and count them into
    ``surface_counts``."""
    rows = pa.table({
        "passage_id": pa.array(np.asarray(passage_ids, np.int64)),
        "entity_id": pa.array(np.asarray(entity_ids, np.int64)),
        "surface": pa.array(list(surfaces), pa.string()),
        "label": pa.array(list(labels), pa.string()),
    })
    if rows.num_rows == 0:
        return
    store.insert("mentions", rows)
    store.con.register("_new_mentions", rows)
    try:
        _count_surfaces(store, "SELECT entity_id, surface, label FROM _new_mentions", sign=1)
    finally:
        store.unregister("_new_mentions")


def _count_surfaces(store: GraphStore, mentions_sql: str, *, sign: int) -> None:
    """Add (``sign`` 1) or subtract (-1) the mentions that ``mentions_sql`` selects (columns
    ``entity_id, surface, label``) to or from ``surface_counts``; rows that reach 0 are deleted
    (every stored count is positive, so only this call's rows can)."""
    delta = f"(SELECT entity_id, surface, label, {int(sign)} * count(*) AS cnt FROM ({mentions_sql}) GROUP BY ALL)"
    # one MERGE: a single scan of ``surface_counts`` (an UPDATE and an anti-joined INSERT scanned it twice)
    added = ("WHEN NOT MATCHED THEN INSERT (entity_id, surface, label, cnt) VALUES (d.entity_id, d.surface, d.label, d.cnt)"
             if sign > 0 else "")
    store.con.execute(f"""
        MERGE INTO surface_counts USING {delta} AS d
        ON surface_counts.entity_id = d.entity_id AND surface_counts.surface = d.surface
           AND surface_counts.label IS NOT DISTINCT FROM d.label
        WHEN MATCHED AND surface_counts.cnt + d.cnt <= 0 THEN DELETE
        WHEN MATCHED THEN UPDATE SET cnt = surface_counts.cnt + d.cnt
        {added}""")


def refresh_surface_forms(store: GraphStore, entity_ids: set[int]) -> None:
    """Recompute surface forms and labels (the most frequent) of ``entity_ids`` from their
    mention counts (``surface_counts``, kept in step with ``mentions`` by :func:`insert_mentions`
    and :func:`delete_document_rows`; aggregating ``mentions`` itself re-read every mention of
    the entities a batch mentions, a cost that grew with the index).

    Only rows whose forms or label change are written: a batch mentions most of the entities
    of a growing index again, and rewriting each of them (a list column) cost 17x the filter
    (1.6 s against 94 ms for 20,000 of 31,183 entities at 100k passages)."""
    if not entity_ids:
        return
    store.changes.touch_labels(entity_ids)
    with store.temp_ids("_forms", sorted(entity_ids)):
        store.con.execute("""
            UPDATE entities SET surface_forms = agg.forms, label = agg.label
            FROM (
                SELECT entity_id,
                       list(DISTINCT surface ORDER BY surface) AS forms,
                       arg_max(label, cnt ORDER BY cnt, label DESC) FILTER (WHERE label IS NOT NULL) AS label
                FROM surface_counts WHERE entity_id IN (SELECT id FROM _forms)
                GROUP BY entity_id
            ) AS agg
            WHERE entities.id = agg.entity_id
              AND (entities.label IS DISTINCT FROM agg.label
                   OR entities.surface_forms IS DISTINCT FROM agg.forms)""")


def add_fact_edge_counts(store: GraphStore, subject_ids: np.ndarray, object_ids: np.ndarray) -> int:
    """Count new fact sources (one per ``(subject, object)`` row, subject != object) into fact
    edges by appending one partial row per pair; returns how many rows were appended.

    A fact edge's weight is the sum of its rows: every reader sums them (the graph snapshot and
    its delta refresh merge duplicate edges, :func:`hipgraph.store.reads.entity_edges_among` and
    the stats count distinct pairs), and :func:`fold_fact_edges` folds them back into one row.
    Updating the stored rows in place (a MERGE) scanned the fact edges every batch, a cost that
    grew with the index (11 -> 45 ms a batch over a 1M-passage build); an append does not."""
    if len(subject_ids) == 0:
        return 0
    lo = np.minimum(subject_ids, object_ids).astype(np.int64)
    hi = np.maximum(subject_ids, object_ids).astype(np.int64)
    pairs, counts = np.unique(np.stack([lo, hi], axis=1), axis=0, return_counts=True)
    store.changes.touch_pairs(pairs[:, 0], pairs[:, 1])
    store.insert("edges", {"type": pa.array(["fact"] * len(pairs), pa.string()),
                           "src": pa.array(pairs[:, 0]), "dst": pa.array(pairs[:, 1]),
                           "weight": pa.array(counts.astype(np.float64))})
    return len(pairs)


def fold_fact_edges(store: GraphStore) -> int:
    """Fold the partial rows of each fact edge (see :func:`add_fact_edge_counts`) into one row
    with their summed weight, inside the caller's transaction; returns the number of fact edges.
    One aggregate over the fact edges, so the writer runs it rarely: when the rows appended since
    the last fold pass a share of the table, and at the end of each write call, after which the
    table holds one row per edge again."""
    con = store.con
    con.execute("""CREATE OR REPLACE TEMP TABLE _fact_fold AS
        SELECT src, dst, sum(weight) AS weight FROM edges WHERE type = 'fact'
        GROUP BY src, dst HAVING count(*) > 1""")
    con.execute("""DELETE FROM edges USING _fact_fold f
        WHERE edges.type = 'fact' AND edges.src = f.src AND edges.dst = f.dst""")
    con.execute("INSERT INTO edges (type, src, dst, weight) SELECT 'fact', src, dst, weight FROM _fact_fold")
    con.execute("DROP TABLE _fact_fold")  # on an error the transaction's rollback drops it
    return int(con.execute("SELECT count(*) FROM edges WHERE type = 'fact'").fetchall()[0][0])


def add_mention_edges(store: GraphStore, passage_ids: np.ndarray, entity_ids: np.ndarray) -> None:
    """Mention edges of new passages: one per distinct (passage, entity) of their mentions."""
    if len(passage_ids) == 0:
        return
    pairs = np.unique(np.stack([np.asarray(passage_ids, np.int64), np.asarray(entity_ids, np.int64)], axis=1), axis=0)
    store.changes.touch_passages(pairs[:, 0])
    store.insert("edges", {
        "type": pa.array(["mention"] * len(pairs), pa.string()),
        "src": pa.array(pairs[:, 0]),
        "dst": pa.array(pairs[:, 1]),
        "weight": pa.array(np.ones(len(pairs))),
    })


# numpy's float32 products find synonym candidates down to this far below the threshold (they
# differ from the exact cosine by ~1e-7), FAISS down to its index's ``candidate_margin`` (the same
# for float vectors, wider for SQ8 codes); each candidate is then decided by :func:`exact_cosines`
CANDIDATE_MARGIN = FLOAT_CANDIDATE_MARGIN


def exact_cosines(left: np.ndarray, right: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Cosines of the float32 unit vectors ``left[i]``, ``right[i]`` and whether each is >= ``threshold``.

    The products of the float32 components are exact in float64; they are summed in a fixed
    order with error-free transformations (compensated "Sum2": as accurate as twice the float64
    precision, within ~1 ulp of the exact sum), and the test compares the exact sum with
    ``threshold`` (inclusive; ``math.fsum`` decides the rare score within 1e-12 of it). Both are
    functions of the two vectors alone: the same whichever entity was new, which batch held
    them, and on which side of the pair each vector was.
    """
    products = np.asfortranarray(np.asarray(left, np.float64) * np.asarray(right, np.float64))  # exact
    total = np.zeros(len(products))
    error = np.zeros(len(products))
    for column in products.T:  # TwoSum per column: total + error is the running sum
        new_total = total + column
        back = new_total - total
        error += (total - (new_total - back)) + (column - back)
        total = new_total
    scores = total + error
    similar = scores >= threshold
    for i in np.nonzero(np.abs(scores - threshold) <= 1e-12)[0].tolist():
        similar[i] = math.fsum([*products[i].tolist(), -threshold]) >= 0.0  # the exact sign
    return similar, scores


def _similar_pairs(store: GraphStore, query_ids: list[int], query_vectors: np.ndarray,
                   found: list[tuple[np.ndarray, np.ndarray]], threshold: float, skip: set[int],
                   ) -> list[tuple[int, int, float]]:
    """``(query id, stored id, cosine)`` of the FAISS candidates ``found`` per query row (stored
    entities not in ``skip``, never the query itself) whose exact cosine is >= ``threshold``."""
    rows, others = [], []
    for row, (ids, _) in enumerate(found):
        for b in ids.tolist():
            if b not in skip and b != query_ids[row]:
                rows.append(row)
                others.append(b)
    if not rows:
        return []
    stored_ids, stored = store.read_vectors("entity", np.unique(np.asarray(others, np.int64)))
    at = {int(i): r for r, i in enumerate(stored_ids.tolist())}
    similar, scores = exact_cosines(query_vectors[rows], stored[[at[b] for b in others]], threshold)
    return [(query_ids[r], b, float(s))
            for r, b, s, keep in zip(rows, others, scores.tolist(), similar.tolist(), strict=True) if keep]


def _similar_within(ids: list[int], vectors: np.ndarray, threshold: float) -> list[tuple[int, int, float]]:
    """``(a, b, cosine)`` with ``a < b`` of the pairs among ``vectors`` with exact cosine >= threshold."""
    rows, cols = [], []
    for lo in range(0, len(ids), 2048):
        sims = vectors[lo:lo + 2048] @ vectors.T
        r, c = np.nonzero(sims >= threshold - CANDIDATE_MARGIN)
        keep = lo + r < c
        rows.extend((lo + r[keep]).tolist())
        cols.extend(c[keep].tolist())
    if not rows:
        return []
    similar, scores = exact_cosines(vectors[rows], vectors[cols], threshold)
    return [(min(ids[r], ids[c]), max(ids[r], ids[c]), float(s))
            for r, c, s, keep in zip(rows, cols, scores.tolist(), similar.tolist(), strict=True) if keep]


def update_synonyms(
    store: GraphStore,
    entity_index: FaissVectorIndex,
    new_ids: np.ndarray,
    new_vectors: np.ndarray,
    removed_ids: np.ndarray,
    removed_vectors: np.ndarray,
    config: SynonymConfig,
) -> int:
    """Keep synonym edges equal to their definition after a batch; returns the net change in
    synonym edges among surviving entities (added minus dropped by entities that became hubs).

    Definition (depends only on the set of entities and their stored vectors, so any sequence of
    adds and deletes gives the edges of a from-scratch build): ``a``-``b`` is a synonym edge when
    the exact cosine of their stored name vectors (:func:`exact_cosines`) is >= ``threshold`` and
    neither has more than ``max_neighbors`` such neighbours (``entities.synonym_degree``); names
    similar to very many others (years, generic nouns) are too unspecific to link. The edge's
    weight is that cosine (unrounded). ``entity_index`` is the FAISS index as of before the
    batch (holding the removed entities, not the new ones); it only proposes candidates. Only new
    and removed entities are searched, plus the few whose degree crosses ``max_neighbors``: never
    a quadratic recomputation.
    """
    thr, cap = config.threshold, config.max_neighbors
    search = thr - entity_index.candidate_margin  # FAISS candidates
    probe = config.candidate_nprobe
    new_vectors = np.ascontiguousarray(new_vectors, np.float32)  # as stored
    removed_vectors = np.ascontiguousarray(removed_vectors, np.float32)
    con = store.con
    removed_list = [int(r) for r in removed_ids]
    removed_set = set(removed_list)
    delta: dict[int, int] = {}
    found = entity_index.range_search(removed_vectors, search, nprobe=probe)
    for _, b, _ in _similar_pairs(store, removed_list, removed_vectors, found, thr, removed_set):
        delta[b] = delta.get(b, 0) - 1
    # pairs that involve a new entity
    pairs: dict[tuple[int, int], float] = {}
    new_list = [int(n) for n in new_ids]
    new_degree = dict.fromkeys(new_list, 0)
    found = entity_index.range_search(new_vectors, search, nprobe=probe)
    for n, b, score in _similar_pairs(store, new_list, new_vectors, found, thr, removed_set):
        delta[b] = delta.get(b, 0) + 1
        new_degree[n] += 1
        pairs[(min(n, b), max(n, b))] = score
    for a, b, score in _similar_within(new_list, new_vectors, thr):
        new_degree[a] += 1
        new_degree[b] += 1
        pairs[(a, b)] = score
    # degrees of old entities before and after
    old_degree = _degrees(store, delta.keys())
    final = {b: old_degree[b] + d for b, d in delta.items() if b in old_degree}
    final.update(new_degree)
    if final:
        ids = sorted(final)
        con.register("_degrees", pa.table({"id": pa.array(ids, pa.int64()),
                                          "deg": pa.array([final[i] for i in ids], pa.int32())}))
        try:
            con.execute("UPDATE entities SET synonym_degree = d.deg FROM _degrees d WHERE entities.id = d.id")
        finally:
            store.unregister("_degrees")
    crossed_up = [b for b in delta if b in old_degree and old_degree[b] <= cap < final[b]]
    crossed_down = [b for b in delta if b in old_degree and old_degree[b] > cap >= final[b]]
    dropped = 0
    if crossed_up:
        with store.temp_ids("_hubs", crossed_up):
            where = """type = 'synonym'
                AND (src IN (SELECT id FROM _hubs) OR dst IN (SELECT id FROM _hubs))"""
            dropped = int(con.execute(f"SELECT count(*) FROM edges WHERE {where}").fetchall()[0][0])
            con.execute(f"DELETE FROM edges WHERE {where}")
        store.changes.touch_entities(crossed_up)
    if crossed_down:  # linkable again: find all their neighbours in the new state
        down_ids, down_vectors = store.read_vectors("entity", np.asarray(sorted(crossed_down)))
        down_list = down_ids.tolist()
        found = entity_index.range_search(down_vectors, search, nprobe=probe)
        for b, c, score in _similar_pairs(store, down_list, down_vectors, found, thr, removed_set):
            pairs[(min(b, c), max(b, c))] = score
        if new_list:
            rows, cols = np.nonzero(down_vectors @ new_vectors.T >= thr - CANDIDATE_MARGIN)
            similar, scores = exact_cosines(down_vectors[rows], new_vectors[cols], thr)
            for r, j, s, keep in zip(rows.tolist(), cols.tolist(), scores.tolist(), similar.tolist(),
                                     strict=True):
                if keep:
                    b, n = down_list[r], new_list[j]
                    pairs[(min(b, n), max(b, n))] = float(s)
    # keep pairs whose ends are both linkable; skip edges that already exist
    degree = dict(final)
    degree.update(_degrees(store, {x for pair in pairs for x in pair} - set(degree)))
    keep = sorted(p for p in pairs if degree.get(p[0], cap + 1) <= cap and degree.get(p[1], cap + 1) <= cap)
    if crossed_down and keep:
        existing = set()
        with store.temp_ids("_down", crossed_down):
            for a, b in con.execute("""SELECT src, dst FROM edges WHERE type = 'synonym'
                    AND (src IN (SELECT id FROM _down) OR dst IN (SELECT id FROM _down))""").fetchall():
                existing.add((int(a), int(b)))
        keep = [p for p in keep if p not in existing]
    if keep:
        store.changes.touch_pairs([a for a, _ in keep], [b for _, b in keep])
        store.insert("edges", {
            "type": pa.array(["synonym"] * len(keep), pa.string()),
            "src": pa.array([a for a, _ in keep], pa.int64()),
            "dst": pa.array([b for _, b in keep], pa.int64()),
            "weight": pa.array([pairs[p] for p in keep], pa.float64()),
        })
    return len(keep) - dropped


def _degrees(store: GraphStore, ids) -> dict[int, int]:
    ids = sorted(int(i) for i in ids)
    if not ids:
        return {}
    with store.temp_ids("_deg_ids", ids):
        rows = store.con.execute(
            "SELECT id, synonym_degree FROM entities WHERE id IN (SELECT id FROM _deg_ids)").fetchall()
    return {int(i): int(d) for i, d in rows}
