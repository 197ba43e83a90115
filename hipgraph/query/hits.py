"""Turning ranked passage ids into :class:`Hit` records (one DuckDB read per batch of queries)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hipgraph.indexers.conversations import SESSION_KIND, unit_times, unit_turns
from hipgraph.store.database import GraphStore
from hipgraph.types import Hit, Hits

Ranked = list[tuple[int, float, dict[str, Any]]]  # (passage id, score, why), best first


def passage_rows(store: GraphStore, passage_ids: set[int]) -> dict[int, tuple[str, str, str]]:
    """``passage id -> (document key, title, text)`` for the given ids (missing ids are absent)."""
    rows: dict[int, tuple[str, str, str]] = {}
    if not passage_ids:
        return rows
    for pid, key, title, text in store.con.execute("""
            SELECT p.id, d.key, p.title, p.text FROM passages p JOIN documents d ON d.id = p.doc_id
            WHERE p.id IN (SELECT unnest(?::BIGINT[]))""", [sorted(passage_ids)]).fetchall():
        rows[int(pid)] = (key, title, text)
    return rows


def memory_rows(store: GraphStore, passage_ids: set[int]) -> dict[int, dict[str, Any]]:
    """For the ids that are conversation memory units: their turn ids, conversation, session and
    time span (``Hit`` fields)."""
    out: dict[int, dict[str, Any]] = {}
    if not passage_ids:
        return out
    rows = store.con.execute("""
        SELECT p.id, p.start_char, p.end_char, d.metadata FROM passages p JOIN documents d ON d.id = p.doc_id
        WHERE p.id IN (SELECT unnest(?::BIGINT[])) AND json_extract_string(d.metadata, '$.kind') = ?""",
                             [sorted(passage_ids), SESSION_KIND]).fetchall()
    for pid, start, end, raw in rows:
        meta = json.loads(raw) if isinstance(raw, str) else raw
        time, time_end = unit_times(meta, start, end)
        turns = [t for t in meta.get("turns", []) if t[2] < end and t[3] > start]
        out[int(pid)] = {"turn_ids": tuple(unit_turns(meta, start, end)),
                         "speakers": tuple(dict.fromkeys(t[1] for t in turns)),
                         "conversation": meta.get("conversation", ""), "session": meta.get("session", ""),
                         "time": time, "time_end": time_end}
    return out


def to_hits(store: GraphStore, rankings: Sequence[Ranked], k: int) -> list[list[Hit]]:
    """The top ``k`` of each ranking as hits; ids no longer stored are skipped."""
    wanted = {pid for ranked in rankings for pid, _, _ in ranked[:k]}
    rows = passage_rows(store, wanted)
    memory = memory_rows(store, wanted)
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
