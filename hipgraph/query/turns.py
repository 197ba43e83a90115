"""Turn-level conversation memory: the turns of the best memory units, each ranked on its own.

A memory unit (a topical segment) is found by any retrieval mode; what a generator with a
context budget needs is its best *turns*, not all of them in order. For each question the
turns of the top ``turn_units`` units (more when they hold fewer than ``k`` turns) are scored

    score = cos(question, "Speaker: text") + turn_bm25_weight * bm25 / max bm25
            + turn_rank_weight / sqrt(1 + unit rank)

where the cosine uses the turn embeddings stored at index time (``turn_vectors``), bm25 is the
turn's BM25 score among all memory turns (divided by the best among the first ``turn_units``
units' turns; 0 when none shares a word with the question) and the unit rank (0 for the best
unit) carries what the mode found: graph paths, time-expression boosts, facts. Ties go to the
better unit, then the earlier turn.

- The turns of units past the first ``turn_units`` (needed only when ``k`` exceeds their turns)
  follow unit by unit, so the top ``k`` turns are the first ``k`` of any deeper request.
- A turn that names the object of a fact replaced since (``ana | live in | lisbon`` after "I
  live in Berlin now"), one of the question's ``graph.fact_top_k`` best-matching facts, is
  scored at ``stale_fact_weight``, unless the question asks about the past (as graph seeding
  weighs such facts).
- Turns of units inside a question's time range (``time_match``, see
  :mod:`hipgraph.query.memory`) come first, as their units do.
- A passage in the ranking that is not a conversation unit (an index that holds documents too)
  is one candidate whose cosine is its passage vector's, with no bm25 part.

The scoring is a pure function (:func:`score_candidates`); :class:`MemoryTurns` holds every
turn of one index generation in one row order.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from hipgraph.query.hits import Ranked
from hipgraph.text.memory_units import unit_turns

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TurnWeights:
    """The scoring weights and candidate depth (see module docstring)."""

    units: int
    rank_weight: float
    bm25_weight: float


class MemoryTurns:
    """Every turn of the memory units of one generation: row ``i`` is turn ``position[i]`` of
    unit ``unit[i]`` (rows ordered by unit, then position), with its id, speaker, ``Speaker:
    text`` line and ISO time (its own, else its session's; "" when unknown)."""

    def __init__(self, rows: Sequence[tuple[int, int, int, str, dict[str, Any]]]):
        units, positions, ids, speakers, texts, times = [], [], [], [], [], []
        self.by_unit: dict[int, tuple[int, int]] = {}
        for pid, start, end, text, meta in rows:
            first = len(units)
            session_time = meta.get("time") or ""
            for pos, turn in unit_turns(meta, start, end):
                units.append(pid)
                positions.append(pos)
                ids.append(turn[0])
                speakers.append(turn[1])
                texts.append(text[max(0, turn[2] - start): turn[3] - start])
                times.append(turn[4] or session_time)
            self.by_unit[pid] = (first, len(units))
        self.unit = np.asarray(units, dtype=np.int64)
        self.position = np.asarray(positions, dtype=np.int64)
        self.ids, self.speakers, self.texts, self.times = ids, speakers, texts, times

    def __len__(self) -> int:
        return len(self.ids)

    def extended(self, rows: Sequence[tuple[int, int, int, str, dict[str, Any]]]) -> MemoryTurns:
        """These turns followed by those of ``rows``, units that come after every unit here
        (equal to building from all the rows, at the cost of the new ones)."""
        more = MemoryTurns(rows)
        if self.by_unit and more.by_unit and min(more.by_unit) <= max(self.by_unit):
            raise ValueError("extended() takes units after the last one held")
        out = MemoryTurns(())
        base = len(self.ids)
        out.by_unit = {**self.by_unit, **{pid: (a + base, b + base) for pid, (a, b) in more.by_unit.items()}}
        out.unit = np.concatenate([self.unit, more.unit])
        out.position = np.concatenate([self.position, more.position])
        out.ids, out.speakers = self.ids + more.ids, self.speakers + more.speakers
        out.texts, out.times = self.texts + more.texts, self.times + more.times
        return out

    def bm25(self, k1: float, b: float):
        """A BM25 index over the turn lines (text ``i`` is row ``i``); the read view keeps it, and
        the next view extends it with the turns a write appended (:class:`LiveBM25`)."""
        from hipgraph.query.bm25 import BM25Config  # noqa: PLC0415
        from hipgraph.query.bm25_live import LiveBM25  # noqa: PLC0415

        return LiveBM25.build(self.texts, BM25Config(k1=k1, b=b))

    def rows_of(self, pid: int) -> range:
        first, end = self.by_unit.get(pid, (0, 0))
        return range(first, end)


def candidates(ranking: Ranked, turns: MemoryTurns, k: int, units: int,
               as_of: datetime | None) -> list[tuple[int, int, int | None]]:
    """``(unit rank, passage id, turn row or None)`` for the turns of the first ``units`` ranked
    passages, and of more passages while fewer than ``k`` candidates are found; a passage that is
    not a memory unit is one candidate (row None). With ``as_of``, turns later than it are
    left out."""
    out: list[tuple[int, int, int | None]] = []
    cut = as_of.isoformat() if as_of is not None else None
    for rank, (pid, _, _) in enumerate(ranking):
        if rank >= units and len(out) >= k:
            break
        if pid not in turns.by_unit:
            out.append((rank, pid, None))
            continue
        for row in turns.rows_of(pid):
            if cut is None or not turns.times[row] or _iso_le(turns.times[row], cut):
                out.append((rank, pid, row))
    return out


def names_any(names: Iterable[str], text: str) -> bool:
    """Whether ``text`` names any of ``names`` (normalised entity names) as whole words."""
    low = text.lower()
    return any(re.search(rf"(?<!\w){re.escape(n)}(?!\w)", low) for n in names if n)


def _iso_le(a: str, b: str) -> bool:
    return datetime.fromisoformat(a) <= datetime.fromisoformat(b)


def score_candidates(cands: Sequence[tuple[int, int, int | None]], cosines: np.ndarray,
                     bm25: np.ndarray, weights: TurnWeights, k: int,
                     first: Sequence[bool] | None = None,
                     factor: Sequence[float] | None = None) -> list[tuple[int, float, dict[str, float]]]:
    """The top ``k`` candidates by the module docstring's score: ``(candidate index, score,
    parts)``. ``cosines[i]`` and ``bm25[i]`` belong to ``cands[i]`` (bm25 0 for non-turns);
    candidates with ``first[i]`` (turns of units inside a question's time range) come before
    the others, as their units do; ``factor[i]`` scales a candidate's score (a turn stating a
    fact replaced since)."""
    base = [b for b, (rank, _, _) in zip(bm25, cands, strict=True) if rank < weights.units]
    best = float(max(base)) if base else 0.0
    scored = []
    for i, (rank, _, row) in enumerate(cands):
        lexical = float(bm25[i]) / best if best > 0 else 0.0
        prior = weights.rank_weight / math.sqrt(1 + rank)
        scale = 1.0 if factor is None else float(factor[i])
        total = scale * (float(cosines[i]) + weights.bm25_weight * lexical + prior)
        parts = {"cosine": round(float(cosines[i]), 6), "bm25": round(lexical, 6),
                 "unit_prior": round(prior, 6)}
        if scale != 1.0:
            parts["stale_factor"] = scale
        tier = 0 if rank < weights.units else rank  # past the first units: unit by unit
        scored.append((not (first[i] if first is not None else False), tier, -total, rank,
                       -1 if row is None else row, i, total, parts))
    scored.sort(key=lambda s: s[:6])
    return [(i, total, parts) for *_, i, total, parts in scored[:k]]


def rank_turns(rankings: Sequence[Ranked], questions: Sequence[str], qvecs: np.ndarray,
               turns: MemoryTurns, vectors_of: Callable[[list[int], list[int]], dict[Any, np.ndarray]],
               bm25_of: Callable[[list[str]], np.ndarray], weights: TurnWeights, k: int,
               as_of: datetime | None, stale: Sequence[dict[int, set[str]]] | None = None,
               stale_weight: float = 1.0) -> list[list[tuple[int, int | None, float, dict[str, Any]]]]:
    """Per question, its top ``k`` turns: ``(passage id, turn row or None, score, why)``.

    ``vectors_of(rows, passage_ids)`` gives the embedding of each turn row (key ``row``) and of
    each non-unit passage (key ``("passage", id)``), for the whole batch in one call;
    ``bm25_of(questions)`` the BM25 score of every turn row per question. ``stale[q]`` maps a
    unit to the objects of replaced facts it states that question ``q`` matches: its turns
    that name one are scored at ``stale_weight``."""
    per_q = [candidates(r, turns, k, weights.units, as_of) for r in rankings]
    rows = sorted({row for cands in per_q for _, _, row in cands if row is not None})
    passages = sorted({pid for cands in per_q for _, pid, row in cands if row is None})
    vecs = vectors_of(rows, passages)
    lexical = bm25_of(list(questions)) if rows and weights.bm25_weight > 0 else None
    out = []
    for qi, (ranking, cands) in enumerate(zip(rankings, per_q, strict=True)):
        if not cands:
            out.append([])
            continue
        keys = [row if row is not None else ("passage", pid) for _, pid, row in cands]
        matrix = np.stack([vecs[key] for key in keys])
        cosines = matrix @ qvecs[qi]
        bm25 = np.array([lexical[qi, row] if lexical is not None and row is not None else 0.0
                         for _, _, row in cands], dtype=np.float64)
        why_of = {pid: why for pid, _, why in ranking}
        first = [bool(why_of[pid].get("time_match")) for _, pid, _ in cands]
        factor = None
        if stale is not None and stale[qi]:
            factor = [stale_weight if row is not None and names_any(stale[qi].get(pid, ()), turns.texts[row])
                      else 1.0 for _, pid, row in cands]
        picked = []
        for i, score, parts in score_candidates(cands, cosines, bm25, weights, k, first, factor):
            rank, pid, row = cands[i]
            picked.append((pid, row, score, {**why_of[pid], "unit_rank": rank + 1, "turn_score": parts}))
        out.append(picked)
    return out
