"""Named read queries over an index's DuckDB tables: the read side's only SQL.

Each function takes the :class:`GraphStore` and runs on the calling thread's cursor, outside any
transaction, so it sees the last committed generation.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from hipgraph.store.database import GraphStore, id_list


def passage_rows(store: GraphStore, passage_ids: Iterable[int]) -> dict[int, tuple[str, str, str]]:
    """``passage id -> (document key, title, text)`` for the given ids (missing ids are absent)."""
    ids = set(passage_ids)
    if not ids:
        return {}
    rows = store.con.execute(f"""
        SELECT p.id, d.key, p.title, p.text FROM passages p JOIN documents d ON d.id = p.doc_id
        WHERE p.id IN ({id_list(ids)})""").fetchall()
    return {int(pid): (key, title, text) for pid, key, title, text in rows}


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
