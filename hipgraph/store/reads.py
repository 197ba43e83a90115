"""Named read queries over an index's DuckDB tables: the read side's only SQL.

Each function takes the :class:`GraphStore` and runs on the calling thread's cursor, outside any
transaction, so it sees the last committed generation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from hipgraph.store.database import GraphStore, id_list, vector_batch


def passage_rows(store: GraphStore, passage_ids: Iterable[int]) -> dict[int, tuple[str, str, str]]:
    """``passage id -> (document key, title, text)`` for the given ids (missing ids are absent)."""
    ids = set(passage_ids)
    if not ids:
        return {}
    rows = store.con.execute(f"""
        SELECT p.id, d.key, p.title, p.text FROM passages p JOIN documents d ON d.id = p.doc_id
        WHERE p.id IN ({id_list(ids)})""").fetchall()
    return {int(pid): (key, title, text) for pid, key, title, text in rows}


def passage_count(store: GraphStore) -> int:
    """How many passages are stored."""
    return int(store.con.execute("SELECT count(*) FROM passages").fetchall()[0][0])


def passage_texts_for_bm25(store: GraphStore) -> tuple[np.ndarray, list[str]]:
    """Every passage id (ascending) with its ``title + "\\n" + text`` (the text alone untitled)."""
    rows = store.con.execute("SELECT id, title, text FROM passages ORDER BY id").fetchall()
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    return ids, [f"{title}\n{text}" if title else text for _, title, text in rows]


def entity_columns(store: GraphStore) -> tuple[list[int], list[str], list[str]]:
    """Every entity's id, normalised name and label ('' for none), by id, as three lists (read
    column-wise, not as row tuples: several times faster on a large index)."""
    ids, names, labels = arrow_columns(store, "SELECT id, name, coalesce(label, '') FROM entities ORDER BY id")
    return ids.tolist(), names.tolist(), labels.tolist()


def fact_triples(store: GraphStore, fact_ids: Iterable[int]) -> dict[int, tuple[int, str, int]]:
    """``fact id -> (subject id, relation, object id)`` for the given ids."""
    ids = list(fact_ids)
    if not ids:
        return {}
    rows = store.con.execute(
        f"SELECT id, subject_id, relation, object_id FROM facts WHERE id IN ({id_list(ids)})").fetchall()
    return {int(i): (int(s), r, int(o)) for i, s, r, o in rows}


def unit_rows(store: GraphStore, kind: str, passage_ids: Iterable[int] | None = None,
              ) -> list[tuple[int, int, int, str, dict[str, Any]]]:
    """``(passage id, start char, end char, text, document metadata)`` of every passage of a
    document whose metadata ``kind`` is ``kind`` (conversation sessions), by passage id; only
    those among ``passage_ids`` when given."""
    sql = """SELECT p.id, p.start_char, p.end_char, p.text, d.metadata FROM passages p
             JOIN documents d ON d.id = p.doc_id
             WHERE json_extract_string(d.metadata, '$.kind') = ?"""
    if passage_ids is None:
        rows = store.con.execute(sql + " ORDER BY p.id", [kind]).fetchall()
    else:
        ids = np.fromiter(passage_ids, dtype=np.int64)
        if not ids.size:
            return []
        with store.temp_ids("_unit_ids", ids) as table:
            rows = store.con.execute(sql + f" AND p.id IN (SELECT id FROM {table}) ORDER BY p.id",
                                     [kind]).fetchall()
    return [(int(pid), start, end, text, json.loads(raw) if isinstance(raw, str) else raw)
            for pid, start, end, text, raw in rows]


def triple_sources(store: GraphStore, passage_ids: Iterable[int]) -> list[tuple[int, int, str, int, str, int]]:
    """The (triple fact, source passage) pairs of the given passages: ``(fact id, subject id,
    relation, object id, object label or '', passage id)``."""
    ids = np.fromiter(passage_ids, dtype=np.int64)
    if not ids.size:
        return []
    with store.temp_ids("_sources", ids) as table:
        return store.con.execute(f"""
            SELECT f.id, f.subject_id, f.relation, f.object_id, coalesce(o.label, ''), fs.passage_id
            FROM {table} t JOIN fact_sources fs ON fs.passage_id = t.id
            JOIN facts f ON f.id = fs.fact_id JOIN entities o ON o.id = f.object_id
            WHERE f.kind = 'triple'""").fetchall()


def arrow_columns(store: GraphStore, sql: str) -> list[np.ndarray]:
    """The result columns of ``sql`` as numpy arrays (strings as object arrays)."""
    table = store.con.sql(sql).to_arrow_table()
    return [table.column(i).to_numpy() for i in range(table.num_columns)]


def content_fingerprint(store: GraphStore) -> dict[str, int]:
    """Row counts and order-independent checksums of what the derived caches (graph snapshot,
    BM25 folders) are built from, in one aggregate query. A cache stamped with another
    fingerprint than the database's was built from other rows (an older or newer database copied
    beside it), whatever its generation number says."""
    row = store.con.execute("""
        SELECT (SELECT count(*) FROM passages),
               (SELECT coalesce(sum(hash(id, title, text_hash)), 0) FROM passages),
               (SELECT count(*) FROM entities), (SELECT coalesce(sum(hash(id)), 0) FROM entities),
               (SELECT count(*) FROM facts),
               (SELECT coalesce(sum(hash(id, subject_id, object_id, kind)), 0) FROM facts),
               (SELECT count(*) FROM edges),
               (SELECT coalesce(sum(hash(type, src, dst, weight)), 0) FROM edges)""").fetchall()[0]
    names = ("passages", "passage_sum", "entities", "entity_sum", "facts", "fact_sum", "edges",
             "edge_sum")
    return {name: int(value) for name, value in zip(names, row, strict=True)}


def passage_ids(store: GraphStore) -> np.ndarray:
    """Every passage id, ascending (int64)."""
    return arrow_columns(store, "SELECT id FROM passages ORDER BY id")[0].astype(np.int64)


def snapshot_columns(store: GraphStore) -> dict[str, list[np.ndarray]]:
    """The columns a graph snapshot is built from: passage and entity ids, mention edges,
    fact/synonym edges with weights (a fact edge possibly as several partial rows, which
    ``to_csr`` sums), and the triple facts' subjects and objects."""
    return {
        "passages": arrow_columns(store, "SELECT id FROM passages ORDER BY id"),
        "entities": arrow_columns(store, "SELECT id FROM entities ORDER BY id"),
        "mentions": arrow_columns(store, "SELECT src, dst FROM edges WHERE type = 'mention'"),
        "entity_edges": arrow_columns(
            store, "SELECT src, dst, weight FROM edges WHERE type IN ('fact', 'synonym')"),
        "facts": arrow_columns(
            store, "SELECT id, subject_id, object_id FROM facts WHERE kind = 'triple' ORDER BY id"),
    }


def present_ids(store: GraphStore, table: str, ids: Iterable[int]) -> np.ndarray:
    """Those of ``ids`` that ``table`` (passages | entities) holds, ascending."""
    if table not in ("passages", "entities"):
        raise ValueError(f"unknown table {table!r}")
    want = np.unique(np.fromiter(ids, dtype=np.int64))
    if not want.size:
        return want
    with store.temp_ids("_present", want) as name:
        return arrow_columns(store, f"SELECT id FROM {table} WHERE id IN (SELECT id FROM {name}) "
                                    "ORDER BY id")[0].astype(np.int64)


def edges_touching(store: GraphStore, passages: np.ndarray, entities: np.ndarray,
                   pairs: np.ndarray) -> list[np.ndarray]:
    """The edges a write may have changed: ``(src, dst, weight, is_mention)`` columns of the
    mention edges of the given passages or entities and of the fact and synonym edges of the
    given entities or between the ends of one of ``pairs`` (an ``(n, 2)`` array of ``(lo, hi)``,
    as edges are stored). One scan of the edges table. A fact edge may come as several partial
    rows (see ``graph_update.add_fact_edge_counts``): the caller sums them, as ``to_csr`` does."""
    pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
    store.con.register("_touch", pa.table({
        "kind": pa.array(["p"] * len(passages) + ["e"] * len(entities) + ["s"] * len(pairs)
                         + ["d"] * len(pairs), pa.string()),
        "id": pa.array(np.concatenate([passages, entities, pairs[:, 0], pairs[:, 1]]).astype(np.int64))}))
    try:
        src, dst, weight, mention = arrow_columns(store, """
            WITH p AS (SELECT id FROM _touch WHERE kind = 'p'), e AS (SELECT id FROM _touch WHERE kind = 'e'),
                 s AS (SELECT id FROM _touch WHERE kind = 's'), d AS (SELECT id FROM _touch WHERE kind = 'd')
            SELECT src, dst, weight, type = 'mention' FROM edges
            WHERE (type = 'mention' AND (src IN (SELECT id FROM p) OR dst IN (SELECT id FROM e)))
               OR (type IN ('fact', 'synonym') AND (src IN (SELECT id FROM e) OR dst IN (SELECT id FROM e)
                   OR (src IN (SELECT id FROM s) AND dst IN (SELECT id FROM d))))""")
    finally:
        store.unregister("_touch")
    src, dst = src.astype(np.int64), dst.astype(np.int64)
    mention = mention.astype(bool)
    if pairs.size:  # src/dst both among the pairs' ends is wider than the pairs themselves
        base = int(max(pairs.max(), src.max(initial=0), dst.max(initial=0))) + 1
        pair_keys = np.unique(pairs[:, 0] * base + pairs[:, 1])
        keys = src * base + dst
        pos = np.minimum(np.searchsorted(pair_keys, keys), pair_keys.size - 1)
        keep = mention | np.isin(src, entities) | np.isin(dst, entities) | (pair_keys[pos] == keys)
        src, dst, weight, mention = src[keep], dst[keep], weight[keep], mention[keep]
    return [src, dst, np.asarray(weight, np.float64), mention]


def triple_facts_by_id(store: GraphStore, fact_ids: Iterable[int]) -> list[np.ndarray]:
    """``(id, subject id, object id)`` columns of the triple facts among ``fact_ids``, by id."""
    ids = np.unique(np.fromiter(fact_ids, dtype=np.int64))
    with store.temp_ids("_fact_ids", ids) as name:
        return arrow_columns(store, f"""SELECT id, subject_id, object_id FROM facts
            WHERE kind = 'triple' AND id IN (SELECT id FROM {name}) ORDER BY id""")


def entity_columns_of(store: GraphStore, entity_ids: Iterable[int]) -> tuple[list[int], list[str], list[str]]:
    """Like :func:`entity_columns`, for the stored entities among ``entity_ids``."""
    ids = np.unique(np.fromiter(entity_ids, dtype=np.int64))
    if not ids.size:
        return [], [], []
    with store.temp_ids("_entity_ids", ids) as name:
        got, names, labels = arrow_columns(store, f"""SELECT id, name, coalesce(label, '') FROM entities
            WHERE id IN (SELECT id FROM {name}) ORDER BY id""")
    return got.tolist(), names.tolist(), labels.tolist()


def entity_ids_named(store: GraphStore, names: Iterable[str]) -> dict[str, int]:
    """``name -> the largest id of an entity with that name`` for the given names."""
    names = sorted(set(names))
    if not names:
        return {}
    return {n: int(i) for n, i in store.con.execute(
        "SELECT name, max(id) FROM entities WHERE name IN (SELECT unnest(?::VARCHAR[])) GROUP BY name",
        [names]).fetchall()}


def document_keys_with_prefix(store: GraphStore, prefix: str) -> list[str]:
    """Keys of the documents whose key starts with ``prefix``."""
    return [k for (k,) in store.con.execute(
        "SELECT key FROM documents WHERE starts_with(key, ?) ORDER BY key", [prefix]).fetchall()]


def triple_facts(store: GraphStore, entity_name: str | None = None,
                 ) -> list[tuple[int, int, str, str, int, str, list[int]]]:
    """Triple facts with names and source passages: ``(fact id, subject id, subject, relation,
    object id, object, passage ids ascending)``; only those naming ``entity_name`` (normalised)
    as subject or object when given."""
    sql = """SELECT f.id, f.subject_id, s.name, f.relation, f.object_id, o.name,
                    list(DISTINCT fs.passage_id ORDER BY fs.passage_id)
             FROM facts f JOIN entities s ON s.id = f.subject_id JOIN entities o ON o.id = f.object_id
             JOIN fact_sources fs ON fs.fact_id = f.id WHERE f.kind = 'triple'"""
    params: list[Any] = []
    if entity_name is not None:
        sql += " AND (s.name = ? OR o.name = ?)"
        params = [entity_name, entity_name]
    return store.con.execute(sql + " GROUP BY ALL", params).fetchall()


def passage_titles(store: GraphStore, passage_ids: list[int]) -> dict[int, tuple[str, str]]:
    """``passage id -> (title, document key)``."""
    if not passage_ids:
        return {}
    return {int(i): (t, k) for i, t, k in store.con.execute(
        "SELECT p.id, p.title, d.key FROM passages p JOIN documents d ON d.id = p.doc_id "
        "WHERE p.id IN (SELECT unnest(?::BIGINT[]))", [passage_ids]).fetchall()}


def entity_labels(store: GraphStore, entity_ids: list[int]) -> dict[int, tuple[str, str]]:
    """``entity id -> (name, label or '')``."""
    if not entity_ids:
        return {}
    return {int(i): (n, lab) for i, n, lab in store.con.execute(
        "SELECT id, name, coalesce(label, '') FROM entities WHERE id IN (SELECT unnest(?::BIGINT[]))",
        [entity_ids]).fetchall()}


def entity_edges_among(store: GraphStore, entity_ids: list[int]) -> list[tuple[str, int, int]]:
    """``(type, src, dst)`` of the fact and synonym edges between the given entities."""
    return [(t, int(s), int(d)) for t, s, d in store.con.execute("""
        SELECT DISTINCT type, src, dst FROM edges WHERE type <> 'mention'
        AND src IN (SELECT unnest(?::BIGINT[])) AND dst IN (SELECT unnest(?::BIGINT[]))""",
        [entity_ids, entity_ids]).fetchall()]


def fact_relations(store: GraphStore, fact_ids: Iterable[int]) -> dict[int, str]:
    """``fact id -> relation`` for the given ids (missing ids are absent)."""
    ids = sorted(set(fact_ids))
    if not ids:
        return {}
    rows = store.con.execute(
        "SELECT id, relation FROM facts WHERE id IN (SELECT unnest(?::BIGINT[]))", [ids]).fetchall()
    return {int(fid): relation for fid, relation in rows}


def fact_ids_by_key(store: GraphStore, keys: Iterable[tuple[int, str, int]]
                    ) -> dict[tuple[int, str, int], int]:
    """``(subject id, relation, object id) -> fact id`` for the keys the index holds."""
    keys = list(keys)
    if not keys:
        return {}
    table = pa.table({"s": pa.array([s for s, _, _ in keys], pa.int64()),
                      "r": pa.array([r for _, r, _ in keys], pa.string()),
                      "o": pa.array([o for _, _, o in keys], pa.int64())})
    store.con.register("_fact_keys", table)
    try:
        rows = store.con.execute(
            "SELECT f.subject_id, f.relation, f.object_id, f.id FROM facts f JOIN _fact_keys k "
            "ON f.subject_id = k.s AND f.relation = k.r AND f.object_id = k.o").fetchall()
    finally:
        store.unregister("_fact_keys")
    return {(int(s), r, int(o)): int(fid) for s, r, o, fid in rows}


def fact_source_passages(store: GraphStore, fact_ids: Iterable[int]) -> dict[int, list[int]]:
    """``fact id -> ids of the passages stating it`` (ascending; facts without sources absent)."""
    ids = sorted(set(fact_ids))
    if not ids:
        return {}
    out: dict[int, list[int]] = {}
    for fid, pid in store.con.execute(
            "SELECT DISTINCT fact_id, passage_id FROM fact_sources "
            "WHERE fact_id IN (SELECT unnest(?::BIGINT[])) ORDER BY ALL", [ids]).fetchall():
        out.setdefault(int(fid), []).append(int(pid))
    return out


def has_turn_vectors(store: GraphStore) -> bool:
    """Whether the index has the ``turn_vectors`` table (version-1 indexes written before it
    lack it until their first writable open)."""
    rows = store.con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'turn_vectors'").fetchall()
    return bool(rows[0][0])


def turn_vectors(store: GraphStore, passage_ids: Iterable[int]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stored turn embeddings of the given memory units: ``(passage ids, turn positions,
    float32 matrix)``, ordered by unit and turn (units without stored turns are absent)."""
    ids = set(passage_ids)
    dim = int(store.meta_get("dimension"))
    if not ids or not has_turn_vectors(store):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, dim), np.float32)
    table = store.con.sql(f"""
        SELECT passage_id, turn, vec FROM turn_vectors WHERE passage_id IN ({id_list(ids)})
        ORDER BY passage_id, turn""").to_arrow_table()
    pids, matrix = vector_batch(table.column("passage_id"), table.column("vec"), dim)
    turns = table.column("turn").to_numpy().astype(np.int64, copy=False)
    return pids, turns, matrix


def document_by_key(store: GraphStore, key: str) -> dict[str, Any] | None:
    """A stored document by its key: ``{"id", "title", "metadata", "added_at", "passages": [{"passage_id",
    "ordinal", "title", "text", "start", "end"}]}`` (passages by ordinal), or None."""
    rows = store.con.execute("SELECT id, title, metadata, added_at FROM documents WHERE key = ?",
                             [key]).fetchall()
    if not rows:
        return None
    doc_id, title, meta, added = rows[0]
    passages = store.con.execute(
        "SELECT id, ordinal, title, text, start_char, end_char FROM passages WHERE doc_id = ? ORDER BY ordinal",
        [doc_id]).fetchall()
    return {"id": key, "title": title,
            "metadata": json.loads(meta) if isinstance(meta, str) else (meta or {}),
            "added_at": added.isoformat() if added is not None else None,
            "passages": [{"passage_id": int(p), "ordinal": int(o), "title": t, "text": x,
                          "start": int(s), "end": int(e)} for p, o, t, x, s, e in passages]}
