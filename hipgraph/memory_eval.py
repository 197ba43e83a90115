"""Evaluation of conversation memory on LoCoMo/LongMemEval files: evidence recall@k per category.

Each conversation is remembered in its own index (``<root>/<conversation id>``, built when
missing). A question's evidence recall@k is the share of its evidence turns among the turns
covered by the top-k memory units. The baseline ``turn-dense`` ranks single turns by cosine
with the same embedder, as a plain vector memory of turns would; it is computed in the same run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hipgraph.config import RetrievalConfig
from hipgraph.types import Conversation

logger = logging.getLogger(__name__)

BASELINE = "turn-dense"


@dataclass
class MemoryResult:
    """Evidence recall (percent) of one mode, overall and per question category."""

    mode: str
    recall: dict[int, float] = field(default_factory=dict)
    by_category: dict[str, dict[int, float]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    ms_per_query: float = 0.0
    qa: dict[str, float] = field(default_factory=dict)  # with a generator: EM, F1, abstentions

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, **{f"recall@{k}": v for k, v in self.recall.items()},
                "ms_per_query": self.ms_per_query, **({"qa": dict(self.qa)} if self.qa else {}),
                "by_category": {c: {"questions": self.counts[c], **{f"recall@{k}": v for k, v in r.items()}}
                                for c, r in self.by_category.items()}}


def evidence_recall(evidence: Sequence[str], turns: Sequence[Sequence[str]], k: int) -> float:
    """Share of ``evidence`` turn ids among the turns of the first ``k`` units."""
    covered = {t for unit in turns[:k] for t in unit}
    return len(set(evidence) & covered) / len(set(evidence))


def evaluate_memory(root: Path, conversations: Sequence[Conversation], questions: Sequence[dict[str, Any]],
                    modes: Sequence[str], cutoffs: Sequence[int], config: RetrievalConfig | None = None,
                    open_index: Callable[..., Any] | None = None, progress: Callable[[int], None] | None = None,
                    generator: Any = None, answer_k: int = 5,
                    ) -> tuple[list[MemoryResult], dict[str, float]]:
    """Evidence recall@k of each mode (and the turn-dense baseline); also the seconds spent
    indexing each conversation that had to be indexed. With ``generator`` (a GeneratorConfig),
    each mode also answers from its top ``answer_k`` units: exact match and token F1 over the
    questions with an answer (adversarial ones excluded), and how often the generator abstained
    on the adversarial (unanswerable) ones."""
    import hipgraph  # noqa: PLC0415

    open_index = open_index or hipgraph.open
    depth = max(cutoffs)
    by_conv: dict[str, list[dict[str, Any]]] = {}
    for q in questions:
        if q.get("evidence"):
            by_conv.setdefault(q["conversation"], []).append(q)
    ranked: dict[str, list[list[list[str]]]] = {m: [] for m in [*modes, BASELINE]}
    answers: dict[str, list[Any]] = {m: [] for m in modes}
    spent: dict[str, float] = {m: 0.0 for m in ranked}
    scored: list[dict[str, Any]] = []
    index_seconds: dict[str, float] = {}
    for conv in conversations:
        qs = by_conv.get(conv.id, [])
        if not qs:
            continue
        path = Path(root) / conv.id
        with open_index(path, create=True) as hg:
            if hg.stats()["documents"] == 0:
                t0 = time.perf_counter()
                hg.add_conversation(conv)
                index_seconds[conv.id] = round(time.perf_counter() - t0, 2)
            texts = [q["question"] for q in qs]
            dates = [q.get("question_date") for q in qs]
            for mode in modes:
                t0 = time.perf_counter()
                hits = hg.retrieve_many(texts, k=depth, mode=mode, config=config, question_dates=dates)
                spent[mode] += time.perf_counter() - t0
                ranked[mode].extend([list(h.turn_ids) for h in hs] for hs in hits)
                if generator is not None:
                    answers[mode].extend(hg.answer_many(texts, k=answer_k, mode=mode, generator=generator,
                                                        config=config, question_dates=dates))
            t0 = time.perf_counter()
            ranked[BASELINE].extend(_turn_dense(hg.embedder, conv, texts, depth))
            spent[BASELINE] += time.perf_counter() - t0
        scored.extend(qs)
        if progress is not None:
            progress(len(qs))
    results = []
    for mode, rankings in ranked.items():
        res = MemoryResult(mode, ms_per_query=round(1000 * spent[mode] / max(1, len(scored)), 2))
        groups: dict[str, list[int]] = {}
        for i, q in enumerate(scored):
            groups.setdefault(q.get("category") or "all", []).append(i)
        for k in sorted(cutoffs):
            per_q = [evidence_recall(q["evidence"], r, k) for q, r in zip(scored, rankings, strict=True)]
            res.recall[k] = round(100 * sum(per_q) / max(1, len(per_q)), 2)
            for g in sorted(groups):
                res.by_category.setdefault(g, {})[k] = round(100 * sum(per_q[i] for i in groups[g]) / len(groups[g]), 2)
                res.counts[g] = len(groups[g])
        if answers.get(mode):
            res.qa = _qa_scores(scored, answers[mode])
        results.append(res)
    return results, index_seconds


def _qa_scores(questions: Sequence[dict[str, Any]], answers: Sequence[Any]) -> dict[str, float]:
    from hipgraph.evaluation import exact_match, token_f1  # noqa: PLC0415

    answerable = [(q, a) for q, a in zip(questions, answers, strict=True)
                  if q.get("answer") and q.get("category") != "adversarial"]
    adversarial = [a for q, a in zip(questions, answers, strict=True) if q.get("category") == "adversarial"]
    n = max(1, len(answerable))
    return {"questions": len(answerable),
            "exact_match": round(100 * sum(exact_match(a.text, [q["answer"]]) for q, a in answerable) / n, 2),
            "f1": round(100 * sum(token_f1(a.text, [q["answer"]]) for q, a in answerable) / n, 2),
            "abstention_rate": round(100 * sum(a.abstained for _, a in answerable) / n, 2),
            "adversarial_abstained": round(100 * sum(a.abstained for a in adversarial) / max(1, len(adversarial)), 2)}


def _turn_dense(embedder, conv: Conversation, questions: list[str], depth: int) -> list[list[list[str]]]:
    """Single turns ranked by cosine (``Speaker: text``, the same embedder)."""
    turns = [t for s in conv.sessions for t in s.turns]
    tv = embedder.embed([f"{t.speaker}: {t.text}" for t in turns])
    qv = embedder.embed(questions)
    sims = qv @ tv.T
    out = []
    for row in sims:
        order = np.lexsort((np.arange(row.size), -row))[:depth]
        out.append([[turns[i].id] for i in order])
    return out
