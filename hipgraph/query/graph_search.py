"""Graph retrieval over one read view: question seeds, one batched PageRank, passages by mass.

:class:`GraphSearch` is what graph mode, decomposition and expansion share: it links question
spans to entities, seeds facts and passages (one embedding call and one PPR for a batch), ranks
passages by PPR mass and explains hits. It reads only its :class:`~hipgraph.query.view.ReadView`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np

from hipgraph.config import GraphRetrievalConfig, RetrievalConfig
from hipgraph.models.base import Embedder
from hipgraph.query.dense import dense_rankings
from hipgraph.query.fact_filter import FactFilter
from hipgraph.query.graph import (
    Seeds,
    make_seeds,
    node_scores,
    reset_matrix,
    strongest_path,
    top_passages,
)
from hipgraph.query.hits import Ranked
from hipgraph.query.linking import EntityNames, QuestionSpans
from hipgraph.query.snapshot import GraphSnapshot
from hipgraph.query.validity import fact_weights
from hipgraph.query.view import ReadView

When = list[tuple[datetime | None, bool]]  # per question: as-of time (None = now), asks about the past


@dataclass
class GraphRun:
    """One batch of graph retrieval: per-question seeds and PPR mass over all nodes.

    ``rows`` maps a question to its row of ``scores`` (questions without graph seeds have none);
    ``best_dense``/``best_fact``: each question's top passage and fact cosine (evidence strength).
    """

    snapshot: GraphSnapshot
    seeds: list[Seeds]
    rows: dict[int, int]
    scores: np.ndarray
    qvec: np.ndarray
    filter_notes: list[str | None]
    best_dense: np.ndarray
    best_fact: np.ndarray


class GraphSearch:
    """Graph retrieval on ``view`` with ``embedder``; ``spans`` finds question entities and
    ``fact_filter`` (an LLM's recognition memory) may choose among seed facts."""

    def __init__(self, view: ReadView, embedder: Embedder, spans: QuestionSpans,
                 fact_filter: FactFilter | None = None):
        self.view = view
        self.embedder = embedder
        self.spans = spans
        self.fact_filter = fact_filter

    def entity_names(self) -> EntityNames:
        return self.view.entity_names()

    def passage_texts(self, passage_ids: list[int]) -> list[tuple[str, str]]:
        return self.view.passage_texts(passage_ids)

    def graph_run(self, questions: list[str], cfg_all: RetrievalConfig,
                  qvec: np.ndarray | None = None,
                  when: When | None = None) -> GraphRun:
        """Seeds and PPR node scores of ``questions`` (one embedding call, one batched PPR);
        ``when`` weighs facts stated in conversations by whether they held (see :meth:`rank`)."""
        cfg = cfg_all.graph
        snap = self.view.snapshot()
        embedder = self.embedder
        linked: list[dict[int, str]] = [{} for _ in questions]
        unmatched: list[tuple[int, str]] = []
        if cfg.link_question_entities and snap.n_entities:
            parsed = getattr(embedder, "parsed", None)  # parses made before the read lock
            for q, pairs in enumerate(self.spans.link(questions, self.entity_names(), parsed=parsed)):
                for span, eid in pairs:
                    idx = int(snap.entity_index(np.array([eid]))[0]) if eid is not None else -1
                    if idx >= 0:
                        linked[q].setdefault(idx, span)
                    else:
                        unmatched.append((q, span))
        # one embedding call for the questions (unless given) and their unlinked spans
        spans = [s for _, s in unmatched]
        if qvec is None:
            vectors = embedder.embed(questions + spans)
            qvec, svec = vectors[: len(questions)], vectors[len(questions):]
        else:
            svec = embedder.embed(spans)
        if unmatched:
            scores, ids = self.view.search("entity", svec, 1)
            idx = snap.entity_index(ids[:, 0])
            for (q, span), s, e in zip(unmatched, scores[:, 0], idx, strict=True):
                if e >= 0 and s >= cfg.link_threshold:
                    linked[q].setdefault(int(e), span)

        n_pass = max(1, min(snap.n_passages, cfg.passage_candidates))
        d_scores, d_ids = self.view.search("passage", qvec, n_pass)
        if snap.fact_ids.size:
            f_scores, f_ids = self.view.search("fact", qvec, min(cfg.fact_candidates, snap.fact_ids.size))
        else:
            f_scores = np.zeros((len(questions), 0), np.float32)
            f_ids = np.zeros((len(questions), 0), np.int64)
        fact_rows = [snap.fact_index(f_ids[q]) for q in range(len(questions))]
        fact_scores = [f_scores[q].astype(np.float64) for q in range(len(questions))]
        if when is not None:
            validity = self.view.fact_times()
            if validity:
                for q, (at, past) in enumerate(when):
                    fact_scores[q] = fact_scores[q] * fact_weights(
                        validity, f_ids[q], at, past, cfg_all.stale_fact_weight)
        filter_notes: list[str | None] = [None] * len(questions)
        threshold = None
        if self.fact_filter is not None and cfg.fact_filter:
            fact_rows, fact_scores, filter_notes = self._filter_facts(
                snap, questions, fact_rows, fact_scores, cfg)
            threshold = -1.0
        seeds: list[Seeds] = []
        for q in range(len(questions)):
            valid = d_ids[q] >= 0
            seeds.append(make_seeds(
                snap, fact_rows[q], fact_scores[q], linked[q],
                snap.passage_nodes(d_ids[q][valid]), d_scores[q][valid], cfg, threshold))
        graph_q = [q for q, s in enumerate(seeds) if s.has_graph_seeds]
        scores = node_scores(snap, reset_matrix(snap, [seeds[q] for q in graph_q]), cfg)
        best_dense = d_scores[:, 0].astype(np.float64) if d_scores.shape[1] else np.zeros(len(questions))
        best_fact = np.array([float(s[0]) if s.size else 0.0 for s in fact_scores])
        return GraphRun(snap, seeds, {q: i for i, q in enumerate(graph_q)}, scores, qvec,
                        filter_notes, best_dense, best_fact)

    def rank_run(self, run: GraphRun, depth: int, cfg: GraphRetrievalConfig,
                 paths: int | None = None) -> list[Ranked]:
        """Best ``depth`` passages per question of a :meth:`graph_run` (dense when unseeded);
        with ``cfg.explain`` each names the question's seeds, and the first ``paths`` (all when
        None) their strongest seed path (the costly part: ~0.8 ms a passage)."""
        snap = run.snapshot
        out: list[Ranked] = []
        dense_fallback = None
        for q in range(len(run.seeds)):
            if q not in run.rows:
                if dense_fallback is None:
                    dense_fallback = dense_rankings(self.view.vectors, run.qvec, depth)
                out.append([(pid, s, {**why, "fallback": "no fact or question entity matched"})
                            for pid, s, why in dense_fallback[q]])
                continue
            row = run.scores[run.rows[q], : snap.n_passages]
            top = top_passages(row, depth)
            base = {"mode": "graph"}
            if run.filter_notes[q]:
                base["fact_filter"] = run.filter_notes[q]
            out.append([(int(snap.passage_ids[node]), score, {**base, "ppr": score})
                        for node, score in top])
            if cfg.explain:
                self._explain(snap, run.seeds[q], top, out[-1], paths)
        return out

    def _filter_facts(self, snap: GraphSnapshot, questions: list[str], rows: list[np.ndarray],
                      scores: list[np.ndarray], cfg: GraphRetrievalConfig):
        """Let the LLM choose among each question's top ``fact_top_k`` facts."""
        tops = []
        for r, s in zip(rows, scores, strict=True):
            ok = r >= 0
            tops.append((r[ok][: cfg.fact_top_k], s[ok][: cfg.fact_top_k]))
        facts = self.view.facts_of([int(snap.fact_ids[i]) for r, _ in tops for i in r])
        candidates = []
        for r, _ in tops:
            triples = []
            for i in r:
                f = facts.get(int(snap.fact_ids[i]), {})
                triples.append((f.get("subject", ""), f.get("relation", ""), f.get("object", "")))
            candidates.append(triples)
        verdicts = self.fact_filter.keep(questions, candidates)
        out_rows, out_scores, notes = [], [], []
        for (r, s), (kept, reason) in zip(tops, verdicts, strict=True):
            if kept is None:  # the filter failed: fall back to the score threshold
                ok = s >= cfg.min_fact_score
                out_rows.append(r[ok])
                out_scores.append(s[ok])
                notes.append(f"not applied ({reason}); used min_fact_score")
            else:
                out_rows.append(r[kept])
                out_scores.append(s[kept])
                notes.append(f"kept {len(kept)} of {len(r)} facts")
        return out_rows, out_scores, notes

    def _explain(self, snap: GraphSnapshot, seeds: Seeds, top: list[tuple[int, float]],
                 ranked: Ranked, n_paths: int | None = None) -> None:
        """Fill each hit's ``why`` with the question's seeds and (the first ``n_paths``) its
        strongest seed path."""
        n_paths = len(top) if n_paths is None else n_paths
        paths = [strongest_path(snap, seeds, node) for node, _ in top[:n_paths]]
        p = snap.n_passages
        names = self.view.entity_names().by_id
        facts = self.view.facts_of([int(snap.fact_ids[r]) for r, _ in seeds.facts])
        seed_facts = [{"fact_id": int(snap.fact_ids[r]), **facts.get(int(snap.fact_ids[r]), {}),
                       "score": round(s, 6)} for r, s in seeds.facts]
        seed_entities = [{"entity_id": int(snap.entity_ids[e]), "name": names.get(int(snap.entity_ids[e]), ""),
                          "weight": round(w, 6), "via": "question" if e in seeds.linked else "fact"}
                         for e, w in sorted(seeds.entities.items(), key=lambda kv: (-kv[1], kv[0]))]
        for _, _, why in ranked:
            why.update({"seed_facts": seed_facts, "seed_entities": seed_entities})
        for (pid, _score, why), (path, path_score) in zip(ranked[:len(paths)], paths, strict=True):
            steps = []
            for n in path:
                if n >= p:
                    eid = int(snap.entity_ids[n - p])
                    steps.append({"entity_id": eid, "name": names.get(eid, "")})
                else:
                    steps.append({"passage_id": int(snap.passage_ids[n])})
            why.update({"path": steps, "path_score": round(path_score, 8),
                        "dense_seed": round(seeds.passages.get(snap.passage_nodes(np.array([pid]))[0].item(), 0.0), 6)})
