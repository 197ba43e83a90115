"""Named read queries over an index's DuckDB tables: the read side's only SQL.

Each function takes the :class:`GraphStore` and runs on the calling thread's cursor, outside any
transaction, so it sees the last committed generation.
"""

from __future__ import annotations

from collections.abc import Iterable

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
