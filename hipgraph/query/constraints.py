"""Decomposed constraint retrieval (``mode="decompose"``, after DRoC).

A question is split into steps (:mod:`hipgraph.query.decompose`); each step is retrieved with graph
retrieval, steps of all questions in one batched wave per chain depth. A step whose text has a
``#k`` slot waits for step ``k``'s bridge: the strongest entity of its best passages (excluding the
step's own anchors, preferring the type its head noun asks for), or the LLM's short answer. A step
whose evidence is weak (best fact and passage cosine below ``weak_score``) is re-retrieved with the
next bridge candidate or, with none left, an expanded query (the LLM's rewrite when configured),
at most ``max_retries`` times; the best attempt is kept and every attempt is traced.

The final ranking fuses the whole question's graph ranking and every step's by reciprocal rank;
after the whole question's best ``question_top`` passages, passages in the top ``cover_depth`` of
more constraints (the whole question counts as one) come first, then by fused score. Each hit's
``why`` lists the constraints (step numbers) it satisfies.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hipgraph.config import DecomposeConfig, RetrievalConfig
from hipgraph.query.decompose import Decomposition, Step
from hipgraph.query.graph_search import GraphSearch
from hipgraph.query.hits import Ranked
from hipgraph.text.normalize import normalize_entity
from hipgraph.types import Hit

logger = logging.getLogger(__name__)

# what a description's head noun asks for, as entity labels (a soft preference, not a filter)
_PLACE = frozenset({"GPE", "LOC", "FAC"})
_HEAD_LABELS: dict[str, frozenset[str]] = {}
for _words, _labels in (
    ("country state city county town village province region continent nation capital place "
     "birthplace location island district municipality area river lake sea ocean mountain "
     "borough neighborhood suburb territory", _PLACE),
    ("person man woman actor actress author writer composer director performer singer "
     "founder president king queen leader player producer father mother son daughter child "
     "wife husband spouse brother sister creator member designer architect artist painter "
     "owner ruler emperor explorer inventor manager coach successor predecessor governor "
     "mayor minister chancellor who whom", frozenset({"PERSON"})),
    ("company group band team university school college organization association party "
     "club label network station publisher manufacturer agency army institution league "
     "navy record", frozenset({"ORG"})),
    ("year date when", frozenset({"DATE"})),
):
    for _w in _words.split():
        _HEAD_LABELS[_w] = _labels
        _HEAD_LABELS[_w + "s"] = _labels


@dataclass
class Attempt:
    """One retrieval of a step: the queries sent (bridge variants, weighted) and the outcome."""

    queries: list[tuple[str, float]]
    evidence: float
    reason: str  # first | next bridge candidates | llm rewrite
    ranking: Ranked = field(default_factory=list, repr=False)
    candidates: list[tuple[str, float]] = field(default_factory=list)
    answer: str | None = None  # the LLM's short answer to the step, when asked
    sufficient: bool | None = None  # the LLM's verdict on the step's context, when asked


@dataclass
class StepTrace:
    """What happened to one step: its attempts, the bridge it produced, its best passages."""

    number: int
    step: Step
    attempts: list[Attempt] = field(default_factory=list)
    chosen: int = 0  # index of the attempt kept
    bridge: str | None = None
    bridge_source: str = ""  # graph | llm

    @property
    def best(self) -> Attempt:
        return self.attempts[self.chosen]

    def to_dict(self, top: int = 5) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.number, "text": self.step.text,
                               "depends_on": list(self.step.depends_on), "bridge": self.bridge,
                               "bridge_source": self.bridge_source, "chosen_attempt": self.chosen}
        out["attempts"] = [{
            "queries": [[q, round(w, 4)] for q, w in a.queries], "evidence": round(a.evidence, 6),
            "reason": a.reason, "top": [pid for pid, _, _ in a.ranking[:top]],
            "bridge_candidates": [[n, round(sc, 6)] for n, sc in a.candidates],
            **({"answer": a.answer} if a.answer is not None else {}),
            **({"sufficient": a.sufficient} if a.sufficient is not None else {}),
        } for a in self.attempts]
        return out


@dataclass
class DecomposedRetrieval:
    """One question's decomposition, step traces and final ranking."""

    decomposition: Decomposition
    steps: list[StepTrace]
    ranking: Ranked
    hits: list[Hit] = field(default_factory=list)  # the top k as hits, filled by the retriever

    def trace(self) -> dict[str, Any]:
        """The decomposition and every step's attempts, bridges and best passages (JSON-able)."""
        return {**self.decomposition.to_dict(), "steps": [s.to_dict() for s in self.steps]}

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.decomposition.question, "trace": self.trace(),
                "hits": [h.to_dict() for h in self.hits]}


@dataclass
class _Pending:
    q: int
    trace: StepTrace
    queries: list[tuple[str, float]]
    reason: str
    used: int = 0  # bridge candidates of the last dependency consumed so far


class ConstraintRunner:
    """Runs decomposed constraint retrieval over a :class:`~hipgraph.query.graph_search.GraphSearch`.

    ``reader`` (optional) is an LLM helper with ``read(question, step, passages)`` returning
    ``(short answer or None, sufficient)`` and ``rewrite(question, step, passages)`` returning a
    new query; without it bridges come from the graph and weak steps try the next candidates.
    """

    def __init__(self, graph: GraphSearch, decomposer, reader=None):
        self.graph = graph
        self.decomposer = decomposer
        self.reader = reader

    def run(self, questions: Sequence[str], depth: int, cfg: RetrievalConfig) -> list[DecomposedRetrieval]:
        dcfg = cfg.decompose
        gcfg = replace(cfg, graph=replace(cfg.graph, explain=False))
        questions = list(questions)
        decs = self.decomposer.decompose_many(questions)
        step_depth = max(depth, dcfg.step_depth)
        traces = [[StepTrace(i, s) for i, s in enumerate(d.steps, start=1)] if len(d.steps) > 1 else []
                  for d in decs]
        # the whole question's ranking runs in the first wave, with the steps that need no bridge
        whole_queries = [(q, [(question, 1.0)]) for q, question in enumerate(questions)]
        wave = [_Pending(q, t, [(t.step.text, 1.0)], "first")
                for q, ts in enumerate(traces) for t in ts if not t.step.depends_on]
        whole: list[Ranked] = []
        started: set[tuple[int, int]] = {(p.q, p.trace.number) for p in wave}
        while wave or not whole:
            batch = [qs for _, qs in whole_queries] if not whole else []
            batch += [p.queries for p in wave]
            heads = [None] * (len(batch) - len(wave)) + [p.trace.step.head for p in wave]
            seen = [set()] * (len(batch) - len(wave)) + [_chain_words(p.trace, traces[p.q]) for p in wave]
            results = self._retrieve_variants(batch, heads, seen, step_depth, gcfg)
            if not whole:
                whole = [r[0] for r in results[: len(questions)]]
                results = results[len(questions):]
            retry: list[_Pending] = []
            for p, (ranking, evidence, candidates) in zip(wave, results, strict=True):
                p.trace.attempts.append(Attempt(p.queries, evidence, p.reason, ranking, candidates))
            self._read(questions, wave, dcfg)
            for p in wave:
                nxt = self._retry(p, traces[p.q], questions[p.q], dcfg)
                if nxt is not None:
                    retry.append(nxt)
                else:
                    self._settle(p.trace, any(p.trace.number in t.step.depends_on for t in traces[p.q]))
            wave = retry
            for q, ts in enumerate(traces):
                for t in ts:
                    key = (q, t.number)
                    if key in started or not all(ts[k - 1].bridge is not None
                                                 for k in t.step.depends_on):
                        continue
                    started.add(key)
                    wave.append(_Pending(q, t, self._variants(t.step, ts, dcfg, 0), "first"))
        out = []
        for q, d in enumerate(decs):
            if not traces[q]:  # nothing to decompose: graph retrieval as is
                out.append(DecomposedRetrieval(d, [], whole[q][:depth]))
            else:
                out.append(DecomposedRetrieval(d, traces[q], self._combine(whole[q], traces[q], depth, cfg)))
        return out

    def _variants(self, step: Step, traces: list[StepTrace], dcfg: DecomposeConfig,
                  start: int) -> list[tuple[str, float]]:
        """Queries for ``step``: its slots filled with bridges; the last dependency's graph
        candidates ``start .. start + beam`` each give one query, weighted by their score."""
        bridges = {k: traces[k - 1].bridge or "" for k in step.depends_on}
        last = traces[step.depends_on[-1] - 1] if step.depends_on else None
        if last is None or last.bridge_source == "llm" or not last.best.candidates:
            return [(step.fill(bridges), 1.0)]
        cands = last.best.candidates[start: start + dcfg.beam]
        if not cands:
            return []
        total = sum(max(sc, 1e-9) for _, sc in cands)
        out = []
        for name, sc in cands:
            filled = step.fill({**bridges, step.depends_on[-1]: name})
            out.append((filled, max(sc, 1e-9) / total))
        return out

    # ------------------------------------------------------------------ retrieval
    def _retrieve_variants(self, batch: list[list[tuple[str, float]]], heads: list[str | None],
                           seen: list[set[str]], depth: int, cfg: RetrievalConfig) -> list[tuple[Ranked, float, list[tuple[str, float]]]]:
        """One batched graph retrieval for every query of every entry; per entry the weighted
        reciprocal-rank fusion of its queries' rankings, the best evidence, and bridge candidates."""
        flat = [query for queries in batch for query, _ in queries]
        run = self.graph.graph_run(flat, cfg)
        rankings = self.graph.rank_run(run, depth, cfg.graph)
        out = []
        i = 0
        for queries, head, words in zip(batch, heads, seen, strict=True):
            fused: dict[int, float] = {}
            cands: dict[str, float] = {}
            evidence = -1.0
            for query, weight in queries:
                for r, (pid, _, _) in enumerate(rankings[i], start=1):
                    fused[pid] = fused.get(pid, 0.0) + weight / (cfg.rrf_k + r)
                evidence = max(evidence, float(max(run.best_fact[i], run.best_dense[i])))
                if head is not None:  # a step, not the whole question
                    for name, sc in self._bridge_candidates(run, i, rankings[i], query, head, words,
                                                            cfg.decompose):
                        cands[name] = cands.get(name, 0.0) + weight * sc
                i += 1
            if len(queries) == 1:
                ranking = rankings[i - 1]
            else:
                order = sorted(fused, key=lambda pid: (-fused[pid], pid))[:depth]
                ranking = [(pid, fused[pid], {"mode": "graph", "rrf": fused[pid]}) for pid in order]
            best = sorted(cands.items(), key=lambda kv: (-kv[1], kv[0]))[: cfg.decompose.bridge_candidates]
            out.append((ranking, evidence, best))
        return out

    def _bridge_candidates(self, run, i: int, ranking: Ranked, query: str, head: str,
                           seen: set[str], dcfg: DecomposeConfig) -> list[tuple[str, float]]:
        """Entities of the best passages, strongest first, excluding the query's own anchors.

        An entity scores its PPR mass over the square root of its passage count (so hubs such as
        "United States" do not win by degree), divided by its best passage's rank, plus the cosine
        of any seed fact it takes part in; then weighted by how well its type fits the head noun.
        """
        snap = run.snapshot
        names = self.graph.entity_names()
        p = snap.n_passages
        seeds = run.seeds[i]
        # the step's anchors and everything earlier steps of its chain named
        anchor_words = _words(query) | {w for s in seeds.linked.values() for w in _words(s)} | seen
        row = run.rows.get(i)
        count = snap.entity_passage_count
        scores: dict[int, float] = {}
        for rank, (pid, _, _) in enumerate(ranking[: dcfg.bridge_passages]):
            node = int(snap.passage_nodes(np.array([pid]))[0])
            if node < 0:
                continue
            nbrs, _ = snap.neighbors(node)
            for n in nbrs[nbrs >= p].tolist():
                e = n - p
                if e in seeds.linked:
                    continue
                mass = float(run.scores[row, n]) if row is not None else 0.0
                mass /= np.sqrt(max(1, int(count[e])))
                scores[e] = max(scores.get(e, 0.0), mass / (1 + rank))
        if scores:  # mass is relative: scale to the best, then add fact support
            top = max(scores.values()) or 1.0
            scores = {e: s / top for e, s in scores.items()}
            for r, cos in seeds.facts:
                for e in (int(snap.fact_subject[r]), int(snap.fact_object[r])):
                    if e in scores:
                        scores[e] += dcfg.fact_support * cos
        wanted = _HEAD_LABELS.get(head, frozenset())
        out = []
        for e, s in scores.items():
            eid = int(snap.entity_ids[e])
            name = names.by_id.get(eid, "")
            words = _words(name)
            if not words or words <= anchor_words or words & anchor_words and len(words) <= 2:
                continue  # the step's own anchor under another spelling
            out.append((name, s * _type_factor(names.label_by_id.get(eid, ""), words, head, wanted, dcfg)))
        out.sort(key=lambda t: (-t[1], t[0]))
        return out[: dcfg.bridge_candidates]

    # ------------------------------------------------------------------ retries and bridges
    def _read(self, questions: list[str], wave: list[_Pending], dcfg: DecomposeConfig) -> None:
        """With an LLM reader: each step's short answer and whether its passages sufficed (one
        concurrent batch of requests per wave)."""
        if self.reader is None or not dcfg.llm_bridges or not wave:
            return
        attempts = [p.trace.attempts[-1] for p in wave]
        items = [(questions[p.q], a.queries[0][0],
                  self.graph.passage_texts([pid for pid, _, _ in a.ranking[: dcfg.read_passages]]))
                 for p, a in zip(wave, attempts, strict=True)]
        for a, (answer, sufficient) in zip(attempts, self.reader.read_many(items), strict=True):
            a.answer, a.sufficient = answer, sufficient

    def _retry(self, p: _Pending, traces: list[StepTrace], question: str,
               dcfg: DecomposeConfig) -> _Pending | None:
        """The next attempt for a weak step, or None when it is settled."""
        attempt = p.trace.attempts[-1]
        weak = attempt.sufficient is False if attempt.sufficient is not None \
            else attempt.evidence < dcfg.weak_score
        if not weak or len(p.trace.attempts) > dcfg.max_retries:
            return None
        if self.reader is not None and dcfg.llm_bridges:
            passages = self.graph.passage_texts(
                [pid for pid, _, _ in attempt.ranking[: dcfg.read_passages]])
            query = self.reader.rewrite(question, attempt.queries[0][0], passages)
            if query and query not in {q for a in p.trace.attempts for q, _ in a.queries}:
                return _Pending(p.q, p.trace, [(query, 1.0)], "llm rewrite")
            return None
        if not p.trace.step.depends_on:
            return None
        used = p.used + dcfg.beam
        queries = self._variants(p.trace.step, traces, dcfg, used)
        return _Pending(p.q, p.trace, queries, "next bridge candidates", used) if queries else None

    def _settle(self, trace: StepTrace, needed: bool = True) -> None:
        """Keep the strongest attempt; the LLM's answer or its best candidate is the bridge
        (of a step another depends on: ``needed``)."""
        def strength(j: int) -> tuple:
            a = trace.attempts[j]
            return (a.sufficient is not False, a.evidence, -j)
        trace.chosen = max(range(len(trace.attempts)), key=strength)
        best = trace.best
        if not needed:
            trace.bridge, trace.bridge_source = None, ""
        elif best.answer:
            trace.bridge, trace.bridge_source = best.answer, "llm"
        elif best.candidates:
            trace.bridge, trace.bridge_source = best.candidates[0][0], "graph"
        else:
            trace.bridge, trace.bridge_source = "", "none"

    # ------------------------------------------------------------------ fusion
    def _combine(self, whole: Ranked, traces: list[StepTrace], depth: int, cfg: RetrievalConfig) -> Ranked:
        dcfg = cfg.decompose
        fused: dict[int, float] = {}
        covers: dict[int, list[int]] = {}
        parts = [(0, whole, dcfg.question_weight)] + [
            (t.number, t.best.ranking, dcfg.step_weight) for t in traces if t.attempts]
        for number, ranking, weight in parts:
            for r, (pid, _, _) in enumerate(ranking, start=1):
                fused[pid] = fused.get(pid, 0.0) + weight / (cfg.rrf_k + r)
                if (number or dcfg.cover_question) and r <= dcfg.cover_depth:
                    covers.setdefault(pid, []).append(number)
        order = sorted(fused, key=lambda pid: (-len(covers.get(pid, [])) if dcfg.coverage_first else 0,
                                               -fused[pid], pid))
        if dcfg.question_top:  # the whole question's best passages keep the first places
            head = [pid for pid, _, _ in whole[: dcfg.question_top]]
            order = head + [pid for pid in order if pid not in head]
        return [(pid, fused[pid], {"mode": "decompose", "rrf": round(fused[pid], 6),
                                   "constraints": covers.get(pid, [])}) for pid in order[:depth]]


_NUMERIC_LABELS = frozenset({"DATE", "TIME", "CARDINAL", "ORDINAL", "PERCENT", "QUANTITY", "MONEY"})
_PLACE_WORDS = frozenset({"country", "state", "city", "county", "province", "region", "district",
                          "town", "village", "island", "continent", "river", "lake", "mountain"})


def _chain_words(trace: StepTrace, traces: list[StepTrace]) -> set[str]:
    """Words of every query and bridge of the steps ``trace`` depends on, transitively."""
    out: set[str] = set()
    todo = list(trace.step.depends_on)
    while todo:
        dep = traces[todo.pop() - 1]
        for a in dep.attempts:
            out |= _words(a.queries[0][0]) if a.queries else set()
        out |= _words(dep.bridge or "")
        todo.extend(dep.step.depends_on)
    return out


def _words(text: str) -> set[str]:
    """Accent-folded word set of ``text`` (words of 3+ characters), for anchor matching."""
    folded = unicodedata.normalize("NFKD", normalize_entity(text))
    folded = "".join(c for c in folded if not unicodedata.combining(c))
    return {w for w in re.findall(r"\w+", folded) if len(w) >= 3}


def _type_factor(label: str, words: set[str], head: str, wanted: frozenset[str],
                 dcfg: DecomposeConfig) -> float:
    """How well an entity of ``label`` named ``words`` fits what the head noun asks for."""
    date_wanted = "DATE" in wanted
    if label in _NUMERIC_LABELS or any(w[:1].isdigit() for w in words):
        return dcfg.type_boost if date_wanted and label in {"DATE", "TIME"} else dcfg.mismatch_factor
    if label == "NOUN_CHUNK":
        factor = dcfg.noun_chunk_factor
    elif wanted and label not in wanted:
        factor = dcfg.mismatch_factor if label == "NORP" or date_wanted else 1.0
    else:
        factor = dcfg.type_boost if wanted else 1.0
    root = head[:-1] if head.endswith("s") and head[:-1] in _PLACE_WORDS else head
    if root and root in words:
        factor *= dcfg.type_boost  # "Lake County" for "the county where ..."
    elif root in _PLACE_WORDS and words & (_PLACE_WORDS - {root}):
        factor *= dcfg.mismatch_factor  # "Ford County" for "the state where ..."
    return factor
