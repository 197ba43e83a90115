"""Turning ranked passage ids into :class:`Hit` records (one DuckDB read per batch of queries)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hipgraph.store.database import GraphStore
from hipgraph.store.reads import passage_rows
from hipgraph.types import Hit, Hits

Ranked = list[tuple[int, float, dict[str, Any]]]  # (passage id, score, why), best first


def to_hits(store: GraphStore, rankings: Sequence[Ranked], k: int,
            memory: Mapping[int, Mapping[str, Any]] | None = None) -> list[list[Hit]]:
    """The top ``k`` of each ranking as hits; ids no longer stored are skipped. ``memory``: the
    conversation units' hit fields (turn ids, session, time) by passage id."""
    rows = passage_rows(store, {pid for ranked in rankings for pid, _, _ in ranked[:k]})
    memory = memory or {}
    results: list[list[Hit]] = []
    for ranked in rankings:
        hits: list[Hit] = Hits()
        for pid, score, why in ranked:
            if pid not in rows:
                continue
            key, title, text = rows[pid]
            hits.append(Hit(doc_id=key, passage_id=pid, title=title, text=text, score=float(score),
                            rank=len(hits) + 1, why=why, **memory.get(pid, {})))
            if len(hits) == k:
                break
        results.append(hits)
    return results
