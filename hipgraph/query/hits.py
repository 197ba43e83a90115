"""Turning ranked passage ids into :class:`Hit` records (one DuckDB read per batch of queries)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hipgraph.types import Hit, Hits

if TYPE_CHECKING:
    from hipgraph.query.turns import MemoryTurns

Ranked = list[tuple[int, float, dict[str, Any]]]  # (passage id, score, why), best first


class PassageRows(Protocol):
    def passage_rows(self, passage_ids: Iterable[int]) -> dict[int, tuple[str, str, str]]:
        """``passage id -> (document key, title, text)``; ids no longer stored are absent."""


def to_hits(source: PassageRows, rankings: Sequence[Ranked], k: int,
            memory: Mapping[int, Mapping[str, Any]] | None = None) -> list[list[Hit]]:
    """The top ``k`` of each ranking as hits (one read of ``source``, a read view); ids no longer
    stored are skipped. ``memory``: the conversation units' hit fields (turn ids, session,
    time) by passage id."""
    rows = source.passage_rows({pid for ranked in rankings for pid, _, _ in ranked[:k]})
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


def turn_hits(source: PassageRows, picked: Sequence[Sequence[tuple[int, int | None, float, dict[str, Any]]]],
              turns: MemoryTurns, memory: Mapping[int, Mapping[str, Any]]) -> list[list[Hit]]:
    """Hits of ranked memory turns ``(passage id, turn row, score, why)``: each hit is one turn
    (its ``Speaker: text`` line, turn id, speaker and time) of the unit ``passage_id``, titled as
    the unit; a row of None is a whole passage that is not a memory unit."""
    rows = source.passage_rows({pid for ranked in picked for pid, _, _, _ in ranked})
    results: list[list[Hit]] = []
    for ranked in picked:
        hits: list[Hit] = Hits()
        for pid, row, score, why in ranked:
            if pid not in rows:
                continue
            key, title, text = rows[pid]
            if row is None:
                hits.append(Hit(doc_id=key, passage_id=pid, title=title, text=text, score=float(score),
                                rank=len(hits) + 1, why=why, **memory.get(pid, {})))
                continue
            unit = memory.get(pid, {})
            time = turns.times[row]
            hits.append(Hit(doc_id=key, passage_id=pid, title=title, text=turns.texts[row],
                            score=float(score), rank=len(hits) + 1, why=why,
                            turn_ids=(turns.ids[row],), speakers=(turns.speakers[row],),
                            conversation=unit.get("conversation", ""), session=unit.get("session", ""),
                            time=time, time_end=time))
        results.append(hits)
    return results
