"""LLM response cache in the index's DuckDB, so re-indexing makes no repeated calls."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timezone

import pyarrow as pa

from hipgraph.store.database import GraphStore

CacheKey = tuple[str, str, str, str]  # model, prompt_version, passage_hash, step


class DuckDBResponseCache:
    """:class:`~hipgraph.indexers.extract_base.ResponseCache` over the ``llm_cache`` table.

    Extraction runs in a worker thread, so each thread gets its own DuckDB cursor (a connection
    to the same database) and commits its cache rows on it, apart from the indexing batch.
    """

    def __init__(self, store: GraphStore):
        self.store = store
        self._local = threading.local()

    def _con(self):
        con = getattr(self._local, "con", None)
        if con is None:
            con = self._local.con = self.store.con.cursor()
        return con

    def get_many(self, keys: Sequence[CacheKey]) -> dict[CacheKey, str]:
        if not keys:
            return {}
        cols = list(zip(*keys, strict=True))
        table = pa.table({name: pa.array(list(col), pa.string()) for name, col in
                          zip(("model", "prompt_version", "passage_hash", "step"), cols, strict=True)})
        con = self._con()
        con.register("_cache_keys", table)
        try:
            rows = con.execute("""
                SELECT c.model, c.prompt_version, c.passage_hash, c.step, c.response
                FROM llm_cache c JOIN _cache_keys k USING (model, prompt_version, passage_hash, step)
            """).fetchall()
        finally:
            con.unregister("_cache_keys")
        return {(m, v, h, s): r for m, v, h, s, r in rows}

    def put_many(self, items: Sequence[tuple[CacheKey, str]]) -> None:
        if not items or self.store.read_only:
            return
        known = self.get_many([key for key, _ in items])
        fresh = {key: value for key, value in items if key not in known}
        if not fresh:
            return
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        keys = list(fresh)
        table = pa.table({
            "model": [k[0] for k in keys], "prompt_version": [k[1] for k in keys],
            "passage_hash": [k[2] for k in keys], "step": [k[3] for k in keys],
            "response": [fresh[k] for k in keys],
            "created_at": pa.array([now] * len(keys), pa.timestamp("us")),
        })
        con = self._con()
        con.register("_cache_rows", table)
        try:
            con.execute("INSERT INTO llm_cache SELECT model, prompt_version, passage_hash, step, "
                        "response, created_at FROM _cache_rows")
        finally:
            con.unregister("_cache_rows")
