"""Retrieval evaluation on QA bundles: recall@k per mode and per hop count.

A bundle is ``{"corpus": [{"idx", "title", "text"}], "questions": [{"id", "question", "gold_idx",
...}]}``; corpus entries are indexed with id ``str(idx)``, so a hit's ``doc_id`` names its corpus
entry. Recall@k of a question is the share of its gold documents among the first ``k`` distinct
documents retrieved (a document split into several passages counts once).
"""

from __future__ import annotations

import collections
import dataclasses
import re
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hipgraph.config import RetrievalConfig
from hipgraph.errors import InputError
from hipgraph.text.json_files import read_json_file
from hipgraph.types import Hit

_HOPS = re.compile(r"^(\d+)hop")


def load_bundle(path: str | Path) -> dict[str, Any]:
    """Read a bundle and check its fields; errors name the file and the offending entry."""
    path = Path(path)
    bundle = read_json_file(path)
    questions = bundle.get("questions") if isinstance(bundle, dict) else None
    if not isinstance(questions, list):
        raise InputError('bundle has no "questions" list', source=str(path))
    for i, q in enumerate(questions):
        if not isinstance(q, dict) or not isinstance(q.get("question"), str) or not q["question"].strip():
            raise InputError(f'questions[{i}] needs a non-empty "question" string', source=str(path))
        gold = q.get("gold_idx")
        if gold is not None and not isinstance(gold, list):
            raise InputError(f'questions[{i}].gold_idx must be a list', source=str(path))
    corpus = bundle.get("corpus", [])
    if not isinstance(corpus, list):
        raise InputError('"corpus" must be a list', source=str(path))
    return bundle


def hop_group(question: dict[str, Any]) -> str | None:
    """``"2hop"``, ``"3hop"``, … from ``meta.hops`` or an id such as ``3hop1__…``; else None."""
    meta = question.get("meta") or {}
    hops = meta.get("hops") if isinstance(meta, dict) else None
    if isinstance(hops, str) and _HOPS.match(hops):
        return f"{_HOPS.match(hops).group(1)}hop"
    match = _HOPS.match(str(question.get("id", "")))
    return f"{match.group(1)}hop" if match else None


def distinct_docs(hits: Sequence[Hit]) -> list[str]:
    seen: dict[str, None] = {}
    for h in hits:
        seen.setdefault(h.doc_id, None)
    return list(seen)


def recall_at(gold: Sequence[Any], docs: Sequence[str], k: int) -> float:
    wanted = {str(g) for g in gold}
    return len(wanted & set(docs[:k])) / len(wanted) if wanted else 0.0


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalization: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    """1.0 when the normalized prediction equals any normalized answer alias."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(a) for a in answers))


def token_f1(prediction: str, answers: Sequence[str]) -> float:
    """Best token-level F1 of the prediction against the answer aliases (SQuAD)."""
    pred = normalize_answer(prediction).split()
    best = 0.0
    for answer in answers:
        gold = normalize_answer(answer).split()
        common = sum((collections.Counter(pred) & collections.Counter(gold)).values())
        if not pred or not gold:
            best = max(best, float(pred == gold))
        elif common:
            precision, recall = common / len(pred), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def answer_aliases(question: dict[str, Any]) -> list[str]:
    """The question's gold answers (``answers`` list or ``answer`` string), empty when none."""
    answers = question.get("answers")
    if isinstance(answers, str):
        return [answers]
    if isinstance(answers, list):
        return [a for a in answers if isinstance(a, str) and a.strip()]
    answer = question.get("answer")
    return [answer] if isinstance(answer, str) and answer.strip() else []


@dataclass
class ModeResult:
    """Recall of one mode: overall and per hop group, in percent, with the time per question."""

    mode: str
    recall: dict[int, float]
    by_hops: dict[str, dict[int, float]] = field(default_factory=dict)
    hop_counts: dict[str, int] = field(default_factory=dict)
    ms_per_query: float = 0.0
    rankings: list[list[str]] = field(default_factory=list)  # distinct doc ids per question
    qa: dict[str, float] = field(default_factory=dict)  # exact_match, f1, abstention_rate (percent)
    decomposition: dict[str, float] = field(default_factory=dict)  # decompose mode vs gold steps
    predictions: list[str | None] = field(default_factory=list)  # per question, with --qa

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode,
                               **{f"recall@{k}": v for k, v in self.recall.items()},
                               "ms_per_query": self.ms_per_query}
        if self.qa:
            out["qa"] = dict(self.qa)
        if self.decomposition:
            out["decomposition"] = dict(self.decomposition)
        if self.by_hops:
            out["by_hops"] = {g: {"questions": self.hop_counts[g],
                                  **{f"recall@{k}": v for k, v in r.items()}}
                              for g, r in self.by_hops.items()}
        return out


def evaluate(hg: Any, questions: Sequence[dict[str, Any]], modes: Sequence[str],
             cutoffs: Sequence[int], config: RetrievalConfig | None = None,
             batch_size: int = 64, generator: Any = None, answer_k: int | None = None) -> list[ModeResult]:
    """Recall@k of each mode over the questions that have ``gold_idx``; with ``generator``
    (a GeneratorConfig other than ``none``), also exact match, token F1 and the abstention rate
    of answers from the top ``answer_k`` passages, over the questions with gold answers."""
    qs = [q for q in questions if q.get("gold_idx")]
    depth = max(cutoffs)
    results = []
    for mode in modes:
        if qs:  # warm-up (model load, compilation, caches) is not part of the per-query time
            hg.retrieve_many([qs[0]["question"]], k=depth, mode=mode, config=config)
        t0 = time.perf_counter()
        rankings: list[list[str]] = []
        decompositions: list[Any] = []
        for start in range(0, len(qs), batch_size):
            batch = [q["question"] for q in qs[start:start + batch_size]]
            if mode == "decompose":  # the same retrieval, keeping the decompositions
                done = hg.retriever.decompose_many(batch, depth * 3, config)
                decompositions.extend(d.decomposition for d in done)
                hits = [d.hits for d in done]
            else:
                hits = hg.retrieve_many(batch, k=depth * 3, mode=mode, config=config)
            rankings.extend(distinct_docs(h)[:depth] for h in hits)
        elapsed = time.perf_counter() - t0
        res = ModeResult(mode=mode, recall={}, rankings=rankings,
                         ms_per_query=round(1000 * elapsed / max(1, len(qs)), 2))
        if decompositions:
            res.decomposition = decomposition_quality(decompositions, qs)
        groups: dict[str, list[int]] = {}
        for i, q in enumerate(qs):
            g = hop_group(q)
            if g:
                groups.setdefault(g, []).append(i)
        for k in sorted(cutoffs):
            per_q = [recall_at(q["gold_idx"], r, k) for q, r in zip(qs, rankings, strict=True)]
            res.recall[k] = round(100 * sum(per_q) / max(1, len(per_q)), 2)
            for g in sorted(groups):
                vals = [per_q[i] for i in groups[g]]
                res.by_hops.setdefault(g, {})[k] = round(100 * sum(vals) / len(vals), 2)
                res.hop_counts[g] = len(vals)
        if generator is not None:
            _score_answers(hg, qs, mode, res, config, generator, answer_k, batch_size)
        results.append(res)
    return results


def decomposition_quality(decompositions: Sequence[Any], questions: Sequence[dict[str, Any]]
                          ) -> dict[str, float]:
    """How predicted steps match gold ones (``meta.question_decomposition``, MuSiQue's format).

    ``step_count_accuracy``: share of questions split into the gold number of steps (percent);
    ``step_f1``: token F1 of each predicted step with the gold step at the same position
    (slots ``#k`` and MuSiQue's ``>>`` dropped; a missing or extra step scores 0), averaged.
    """
    pairs = [(d, q["meta"]["question_decomposition"]) for d, q in zip(decompositions, questions, strict=True)
             if isinstance(q.get("meta"), dict) and isinstance(q["meta"].get("question_decomposition"), list)
             and q["meta"]["question_decomposition"]]
    if not pairs:
        return {}
    same = f1 = 0.0
    for dec, gold in pairs:
        pred = [_step_words(s.text) for s in dec.steps]
        ref = [_step_words(str(g.get("question", ""))) for g in gold]
        same += len(pred) == len(ref)
        f1 += sum(token_f1(p, [r]) for p, r in zip(pred, ref, strict=False)) / max(len(pred), len(ref))
    n = len(pairs)
    return {"questions": n, "step_count_accuracy": round(100 * same / n, 2),
            "step_f1": round(100 * f1 / n, 2)}


def _step_words(text: str) -> str:
    return re.sub(r"#\d+|>>", " ", text)


def _score_answers(hg: Any, qs: Sequence[dict[str, Any]], mode: str, res: ModeResult,
                   config: RetrievalConfig | None, generator: Any, k: int, batch_size: int) -> None:
    answerable = [(i, q) for i, q in enumerate(qs) if answer_aliases(q)]
    res.predictions = [None] * len(qs)
    if getattr(generator, "on_invalid", None) == "raise":  # one bad reply must not end a run
        generator = dataclasses.replace(generator, on_invalid="abstain")
    em = f1 = abstained = invalid = 0.0
    for start in range(0, len(answerable), batch_size):
        batch = answerable[start:start + batch_size]
        answers = hg.answer_many([q["question"] for _, q in batch], k=k, mode=mode,
                                 generator=generator, config=config)
        for (i, q), answer in zip(batch, answers, strict=True):
            res.predictions[i] = answer.text
            abstained += answer.abstained
            invalid += "error" in answer.usage
            em += exact_match(answer.text, answer_aliases(q))
            f1 += token_f1(answer.text, answer_aliases(q))
    n = max(1, len(answerable))
    res.qa = {"questions": len(answerable), "exact_match": round(100 * em / n, 2),
              "f1": round(100 * f1 / n, 2), "abstention_rate": round(100 * abstained / n, 2),
              "invalid_rate": round(100 * invalid / n, 2)}
