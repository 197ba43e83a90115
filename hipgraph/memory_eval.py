"""Evaluation of conversation memory on LoCoMo/LongMemEval files: evidence recall per category,
at a budget of retrieved turns, at a token budget and (secondary) over the top-k memory units.

Each conversation is remembered in its own index (``<root>/<conversation id>``, built when
missing). The baseline ``turn-dense`` ranks single turns by cosine with the same embedder, as a
plain vector memory of turns would; it is computed in the same run.

- **Turn budget B**: hits are taken in rank order and each hit's ``turn_ids`` in the order the
  hit lists them, skipping turns already taken, until B turns (:func:`budget_turns`); the
  baseline's are its top B turns. Recall is the share of the question's evidence turns among them.
- **Token budget N**: turns are taken in the same order while their running token total stays
  within N; a turn costs :func:`turn_tokens` (``Speaker: text`` counted with the context
  builder's estimate, :func:`hipgraph.generation.context.estimate_tokens`; separators and
  citation numbers are not counted). The first turn that does not fit stops the fill and is not
  taken, so a first turn longer than N leaves nothing (:func:`token_budget_turns`).
- Both budgets leave out adversarial (unanswerable) questions (category ``adversarial``,
  LoCoMo's category 5); unit-level recall@k counts every question with evidence, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hipgraph.config import RetrievalConfig
from hipgraph.generation.context import estimate_tokens
from hipgraph.types import Conversation

logger = logging.getLogger(__name__)

BASELINE = "turn-dense"
ADVERSARIAL = "adversarial"  # unanswerable questions: left out of the budget metrics
TURN_BUDGETS = (5, 10, 20)
TOKEN_BUDGETS = (500, 1000, 2000)


@dataclass
class MemoryResult:
    """Evidence recall (percent) of one mode, overall and per question category: within B
    retrieved turns (``turn_budget``), within N tokens of turns (``token_budget``), both over
    the ``budget_questions`` non-adversarial questions, and within the top-k units (``recall``,
    every question with evidence)."""

    mode: str
    recall: dict[int, float] = field(default_factory=dict)
    by_category: dict[str, dict[int, float]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    ms_per_query: float = 0.0
    qa: dict[str, float] = field(default_factory=dict)  # with a generator: EM, F1, abstentions
    turn_budget: dict[int, float] = field(default_factory=dict)
    token_budget: dict[int, float] = field(default_factory=dict)
    turn_budget_by_category: dict[str, dict[int, float]] = field(default_factory=dict)
    token_budget_by_category: dict[str, dict[int, float]] = field(default_factory=dict)
    budget_questions: int = 0

    def to_dict(self) -> dict[str, Any]:
        """``turns@B``, ``tokens@N`` and ``recall@k`` keys, overall and under ``by_category``."""
        def budgets(turns: dict[int, float], tokens: dict[int, float]) -> dict[str, float]:
            return {**{f"turns@{b}": v for b, v in turns.items()},
                    **{f"tokens@{n}": v for n, v in tokens.items()}}

        return {"mode": self.mode, **budgets(self.turn_budget, self.token_budget),
                "budget_questions": self.budget_questions,
                **{f"recall@{k}": v for k, v in self.recall.items()},
                "ms_per_query": self.ms_per_query, **({"qa": dict(self.qa)} if self.qa else {}),
                "by_category": {c: {"questions": self.counts[c],
                                    **budgets(self.turn_budget_by_category.get(c, {}),
                                              self.token_budget_by_category.get(c, {})),
                                    **{f"recall@{k}": v for k, v in r.items()}}
                                for c, r in self.by_category.items()}}


def evidence_recall(evidence: Sequence[str], turns: Sequence[Sequence[str]], k: int) -> float:
    """Share of ``evidence`` turn ids among the turns of the first ``k`` units."""
    covered = {t for unit in turns[:k] for t in unit}
    return len(set(evidence) & covered) / len(set(evidence))


def budget_turns(hits_turns: Sequence[Sequence[str]], budget: int) -> list[str]:
    """The first ``budget`` distinct turn ids of ranked hits, each hit's in its own order."""
    taken: dict[str, None] = {}
    for unit in hits_turns:
        for turn in unit:
            taken.setdefault(turn, None)
            if len(taken) == budget:
                return list(taken)
    return list(taken)


def token_budget_turns(hits_turns: Sequence[Sequence[str]], budget: int,
                       tokens: Mapping[str, int]) -> list[str]:
    """Distinct turn ids of ranked hits, in order, while their ``tokens`` sum stays within
    ``budget``; the first turn that does not fit stops the fill (and is not taken)."""
    taken: dict[str, None] = {}
    used = 0
    for unit in hits_turns:
        for turn in unit:
            if turn in taken:
                continue
            if used + tokens[turn] > budget:
                return list(taken)
            used += tokens[turn]
            taken[turn] = None
    return list(taken)


def turn_tokens(conv: Conversation) -> dict[str, int]:
    """Each turn's token cost: ``estimate_tokens("Speaker: text")`` (1.3 per word or mark)."""
    return {t.id: estimate_tokens(f"{t.speaker}: {t.text}") for s in conv.sessions for t in s.turns}


def budget_recall(evidence: Sequence[str], taken: Sequence[str]) -> float:
    """Share of ``evidence`` turn ids among the ``taken`` turns."""
    return len(set(evidence) & set(taken)) / len(set(evidence))


def _fills(hits_turns: Sequence[Sequence[str]], budget: int, tokens: Mapping[str, int]) -> bool:
    """Whether the distinct turns of the hits hold more than ``budget`` tokens (the fill stops
    on a turn that does not fit, so deeper hits cannot change it)."""
    return sum(tokens[t] for t in {t for unit in hits_turns for t in unit}) > budget


def evaluate_memory(root: Path, conversations: Sequence[Conversation], questions: Sequence[dict[str, Any]],
                    modes: Sequence[str], cutoffs: Sequence[int], config: RetrievalConfig | None = None,
                    open_index: Callable[..., Any] | None = None, progress: Callable[[int], None] | None = None,
                    generator: Any = None, answer_k: int | None = None,
                    turn_budgets: Sequence[int] = TURN_BUDGETS,
                    token_budgets: Sequence[int] = TOKEN_BUDGETS,
                    ) -> tuple[list[MemoryResult], dict[str, float]]:
    """Evidence recall of each mode and of the turn-dense baseline (module docstring) at each
    turn budget, token budget and unit cut-off; also the seconds spent indexing each
    conversation that had to be indexed. Modes retrieve ``max(cutoffs, turn_budgets)`` units
    (timed in ``ms_per_query``); a question whose units hold too few tokens for the largest
    token budget is retrieved again at twice the depth until they do or the memory runs out
    (not timed). With ``generator`` (a GeneratorConfig), each mode also answers from its top
    ``answer_k`` hits (None: as many turns as the generator's context budget holds): exact match and token F1 over the questions with an answer (adversarial
    ones excluded), and how often the generator abstained on the adversarial (unanswerable) ones."""
    import hipgraph  # noqa: PLC0415

    open_index = open_index or hipgraph.open
    turn_budgets, token_budgets = sorted(set(turn_budgets)), sorted(set(token_budgets))
    if any(b < 1 for b in [*cutoffs, *turn_budgets, *token_budgets]):
        raise ValueError("cut-offs and budgets must be >= 1")
    depth = max([*cutoffs, *turn_budgets])
    by_conv: dict[str, list[dict[str, Any]]] = {}
    for q in questions:
        if q.get("evidence"):
            by_conv.setdefault(q["conversation"], []).append(q)
    ranked: dict[str, list[list[list[str]]]] = {m: [] for m in [*modes, BASELINE]}
    deep: dict[str, list[list[list[str]]]] = {m: [] for m in ranked}  # for the token budgets
    costs: list[dict[str, int]] = []  # per scored question: its conversation's turn tokens
    answers: dict[str, list[Any]] = {m: [] for m in modes}
    spent: dict[str, float] = {m: 0.0 for m in ranked}
    scored: list[dict[str, Any]] = []
    index_seconds: dict[str, float] = {}
    for conv in conversations:
        qs = by_conv.get(conv.id, [])
        if not qs:
            continue
        path = Path(root) / conv.id
        tokens = turn_tokens(conv)
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
                units = [[list(h.turn_ids) for h in hs] for hs in hits]
                ranked[mode].extend(units)
                deep[mode].extend(_deepen(hg, texts, dates, units, depth, mode, config,
                                          max(token_budgets, default=0), tokens))
                if generator is not None:
                    answers[mode].extend(hg.answer_many(texts, k=answer_k, mode=mode, generator=generator,
                                                        config=config, question_dates=dates))
            t0 = time.perf_counter()
            turn_ranking = _turn_dense(hg.embedder, conv, texts)
            spent[BASELINE] += time.perf_counter() - t0
            ranked[BASELINE].extend(r[:depth] for r in turn_ranking)
            deep[BASELINE].extend(turn_ranking)
        scored.extend(qs)
        costs.extend([tokens] * len(qs))
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
        _score_budgets(res, scored, rankings, deep[mode], costs, turn_budgets, token_budgets)
        if answers.get(mode):
            res.qa = _qa_scores(scored, answers[mode])
        results.append(res)
    return results, index_seconds


def _deepen(hg: Any, texts: list[str], dates: list[Any], units: list[list[list[str]]], depth: int,
            mode: str, config: RetrievalConfig | None, need: int,
            tokens: Mapping[str, int]) -> list[list[list[str]]]:
    """``units`` with the questions whose units hold at most ``need`` tokens retrieved again at
    doubling depth, until they hold more or the ranking is shorter than asked (memory exhausted)."""
    units = list(units)
    todo = [i for i, u in enumerate(units) if need and len(u) == depth and not _fills(u, need, tokens)]
    while todo:
        depth *= 2
        hits = hg.retrieve_many([texts[i] for i in todo], k=depth, mode=mode, config=config,
                                question_dates=[dates[i] for i in todo])
        for i, hs in zip(todo, hits, strict=True):
            units[i] = [list(h.turn_ids) for h in hs]
        todo = [i for i in todo if len(units[i]) == depth and not _fills(units[i], need, tokens)]
    return units


def _score_budgets(res: MemoryResult, questions: Sequence[dict[str, Any]],
                   rankings: Sequence[Sequence[Sequence[str]]], deep: Sequence[Sequence[Sequence[str]]],
                   costs: Sequence[Mapping[str, int]], turn_budgets: Sequence[int],
                   token_budgets: Sequence[int]) -> None:
    """Fill ``res``'s turn- and token-budget recall over the non-adversarial questions."""
    kept = [i for i, q in enumerate(questions) if q.get("category") != ADVERSARIAL]
    res.budget_questions = len(kept)
    groups: dict[str, list[int]] = {}
    for i in kept:
        groups.setdefault(questions[i].get("category") or "all", []).append(i)

    def fill(target: dict[int, float], by_cat: dict[str, dict[int, float]], budget: int,
             per_q: dict[int, float]) -> None:
        target[budget] = round(100 * sum(per_q.values()) / max(1, len(per_q)), 2)
        for g in sorted(groups):
            by_cat.setdefault(g, {})[budget] = round(100 * sum(per_q[i] for i in groups[g]) / len(groups[g]), 2)

    for b in turn_budgets:
        per_q = {i: budget_recall(questions[i]["evidence"], budget_turns(rankings[i], b)) for i in kept}
        fill(res.turn_budget, res.turn_budget_by_category, b, per_q)
    for n in token_budgets:
        per_q = {i: budget_recall(questions[i]["evidence"], token_budget_turns(deep[i], n, costs[i]))
                 for i in kept}
        fill(res.token_budget, res.token_budget_by_category, n, per_q)


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


def _turn_dense(embedder, conv: Conversation, questions: list[str]) -> list[list[list[str]]]:
    """All single turns ranked by cosine (``Speaker: text``, the same embedder; ties by order)."""
    turns = [t for s in conv.sessions for t in s.turns]
    tv = embedder.embed([f"{t.speaker}: {t.text}" for t in turns])
    qv = embedder.embed(questions)
    sims = qv @ tv.T
    out = []
    for row in sims:
        order = np.lexsort((np.arange(row.size), -row))
        out.append([[turns[i].id] for i in order])
    return out
