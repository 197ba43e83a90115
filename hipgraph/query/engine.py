"""Retrieval modes over one open index: ``graph`` (default), ``dense``, ``bm25`` and ``hybrid``.

:class:`Retriever` owns the query-time state derived from the store (graph snapshot, entity names,
BM25 index), refreshes it when the index generation changes, and turns rankings into hits.
It never calls a generator.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from hipgraph.config import ChatConfig, GraphRetrievalConfig, RetrievalConfig
from hipgraph.errors import ConfigError
from hipgraph.indexers.conversations import SESSION_KIND, unit_record
from hipgraph.models.base import Embedder
from hipgraph.models.chat import ChatClient
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
from hipgraph.query.hits import Ranked, passage_rows, to_hits
from hipgraph.query.linking import EntityNames, QuestionSpans
from hipgraph.query.memory import apply_time, asks_about_past, parse_question_dates
from hipgraph.query.snapshot import GraphSnapshot, current_snapshot
from hipgraph.query.validity import FactTime, fact_times, fact_weights
from hipgraph.store.database import GraphStore, id_list
from hipgraph.store.vector_set import VectorSet
from hipgraph.temporal import TimeRange, event_relative, parse_time, resolve_range
from hipgraph.types import Hit

if TYPE_CHECKING:
    from hipgraph.query.constraints import DecomposedRetrieval
    from hipgraph.query.expand import Expansion

logger = logging.getLogger(__name__)

MODES = ("graph", "dense", "bm25", "hybrid", "decompose", "expand")


def validate_request(questions: Sequence[str], k: int, mode: str) -> None:
    """Errors for bad retrieval input, naming the offending value."""
    if isinstance(questions, str):
        raise ConfigError("retrieve_many takes a list of questions, not one string")
    if mode not in MODES:
        raise ConfigError(f"unknown retrieval mode {mode!r}; available: {', '.join(MODES)}")
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ConfigError(f"k must be an integer >= 1, got {k!r}")
    for i, q in enumerate(questions):
        if not isinstance(q, str) or not q.strip():
            raise ConfigError(f"question {i} is empty" if isinstance(q, str)
                              else f"question {i} is not a string: {type(q).__name__}")


@contextlib.contextmanager
def _blas_threads(n: int) -> Iterator[None]:
    """Hold numpy's BLAS (used by spaCy's parser) to ``n`` threads while a query runs.

    OpenBLAS workers spin after each call; on a small machine they starve the embedder's torch
    threads that run next (a 64-question graph batch took 10.5 s instead of 0.5 s on 2 cores).
    """
    controller = _threadpool_controller()
    if controller is None:
        yield
        return
    with controller.limit(limits=n, user_api="blas"):
        yield


@functools.cache
def _threadpool_controller():
    """One controller per process (building it scans the loaded libraries: ~1.5 ms)."""
    try:
        from threadpoolctl import ThreadpoolController  # noqa: PLC0415
    except ImportError:  # optional: without it queries are only slower on small machines
        return None
    return ThreadpoolController()


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


class Retriever:
    """Query engine of one index (see module docstring)."""

    def __init__(self, store: GraphStore, vectors: VectorSet, embedder: Callable[[], Embedder],
                 spacy_model: str, config: RetrievalConfig,
                 chat_client: Callable[[ChatConfig], ChatClient] = ChatClient):
        self.store = store
        self._chat_client = chat_client  # shared with the generator by the owning HipGraph
        self.vectors = vectors
        self._embedder = embedder
        self.config = config
        self._spans = QuestionSpans(spacy_model)
        self._spacy_model = spacy_model
        self._rule_decomposer = None
        self._units: tuple[int, dict[int, dict[str, Any]], dict[int, tuple[datetime, datetime]]] | None = None
        self._fact_times: tuple[int, dict[int, FactTime]] | None = None
        self._snapshot: GraphSnapshot | None = None
        self._names: EntityNames | None = None
        self._bm25: Any = None
        self._bm25_generation = -1
        self._filter: FactFilter | None = None

    # ------------------------------------------------------------------ derived state
    def snapshot(self) -> GraphSnapshot:
        self._snapshot = current_snapshot(self.store, self._snapshot, self.store.generation)
        return self._snapshot

    def entity_names(self) -> EntityNames:
        if self._names is None or self._names.generation != self.store.generation:
            self._names = EntityNames(self.store)
        return self._names

    def _bm25_index(self, cfg: RetrievalConfig):
        from hipgraph.query.bm25 import BM25Config, BM25Index  # noqa: PLC0415 - optional mode

        generation = self.store.generation
        bm_cfg = BM25Config(k1=cfg.bm25_k1, b=cfg.bm25_b)
        if self._bm25 is not None and self._bm25_generation == generation \
                and self._bm25.config == bm_cfg:
            return self._bm25
        root = self.store.root / "cache" / "bm25"
        folder = root / f"g{generation}-k{bm_cfg.k1:g}-b{bm_cfg.b:g}"
        index = None
        if folder.exists():
            try:
                index = BM25Index.load(folder, bm_cfg)
            except Exception as exc:  # noqa: BLE001 - a broken cache is rebuilt, never fatal
                logger.info("bm25 cache %s unusable (%s); rebuilding", folder, exc)
        if index is None:
            rows = self.store.con.execute(
                "SELECT id, title, text FROM passages ORDER BY id").fetchall()
            ids = np.array([r[0] for r in rows], dtype=np.int64)
            index = BM25Index.build(ids, [f"{r[1]}\n{r[2]}" if r[1] else r[2] for r in rows], bm_cfg)
            try:
                if root.exists():
                    for old in root.iterdir():
                        shutil.rmtree(old, ignore_errors=True)
                index.save(folder)
            except OSError as exc:
                logger.warning("cannot write bm25 cache %s (%s); keeping it in memory", folder, exc)
        self._bm25, self._bm25_generation = index, generation
        return index

    # ------------------------------------------------------------------ entry point
    def close(self) -> None:
        self._filter = None  # its client belongs to whoever made it (the HipGraph)

    def retrieve_many(self, questions: Sequence[str], k: int, mode: str,
                      config: RetrievalConfig | None = None, question_dates: Sequence[Any] | None = None,
                      as_of: Any = None) -> list[list[Hit]]:
        validate_request(questions, k, mode)
        questions = list(questions)
        if not questions:
            return []
        cfg = config or self.config
        dates = parse_question_dates(question_dates, len(questions), parse_time)
        as_of_t = parse_time(as_of, where="as_of") if as_of is not None else None
        with _blas_threads(1):
            times = self._memory()[1]
            if not times:
                return self.hits(self.rank(questions, k, mode, cfg), k)
            # conversation memory: time expressions, facts weighed by when they held, as_of
            spans = [resolve_range(q, d or as_of_t) for q, d in zip(questions, dates, strict=True)]
            when = [(as_of_t, asks_about_past(q, span, d or as_of_t))
                    for q, span, d in zip(questions, spans, dates, strict=True)]
            rankings = self.rank(questions, max(k, cfg.memory_candidates), mode, cfg, when=when)
            self._event_spans(questions, spans, times)
            rankings = [apply_time(r, times, span, as_of_t, cfg.time_mode)
                        for r, span in zip(rankings, spans, strict=True)]
            return self.hits(rankings, k)

    def hits(self, rankings: Sequence[Ranked], k: int) -> list[list[Hit]]:
        """The top ``k`` of each ranking as hits (conversation units with their turns and time)."""
        return to_hits(self.store, rankings, k, self._memory()[0])

    def _event_spans(self, questions: list[str], spans: list[TimeRange | None],
                     times: dict[int, tuple[datetime, datetime]]) -> None:
        """Fill the spans of questions anchored on an event ("two weeks before the trip"): the
        event (with the question's names) is looked up among the memory units by embedding, and
        the best unit's time anchors the range."""
        todo = [(i, ev) for i, (q, span) in enumerate(zip(questions, spans, strict=True))
                if span is None and (ev := event_relative(q)) is not None]
        if not todo:
            return
        names = [" ".join(re.findall(r"\b[A-Z][\w'-]+", questions[i][1:])) for i, _ in todo]
        vecs = self._embedder().embed([f"{n} {ev.event}".strip() for (_, ev), n in zip(todo, names, strict=True)])
        _, ids = self.vectors.search("passage", vecs, 10)
        for (i, ev), row in zip(todo, ids, strict=True):
            anchor = next((times[int(p)][0] for p in row if int(p) in times), None)
            if anchor is not None:
                spans[i] = ev.resolve(anchor)

    def _memory(self) -> tuple[dict[int, dict[str, Any]], dict[int, tuple[datetime, datetime]]]:
        """Conversation memory units, read once per index generation: each unit's hit fields and
        its time span (units without a time have no span)."""
        if self._units is None or self._units[0] != self.store.generation:
            rows = self.store.con.execute("""
                SELECT p.id, p.start_char, p.end_char, d.metadata FROM passages p
                JOIN documents d ON d.id = p.doc_id
                WHERE json_extract_string(d.metadata, '$.kind') = ?""", [SESSION_KIND]).fetchall()
            records: dict[int, dict[str, Any]] = {}
            times: dict[int, tuple[datetime, datetime]] = {}
            for pid, start, end, raw in rows:
                rec = unit_record(json.loads(raw) if isinstance(raw, str) else raw, start, end)
                records[int(pid)] = rec
                if rec["time"]:
                    times[int(pid)] = (datetime.fromisoformat(rec["time"]), datetime.fromisoformat(rec["time_end"]))
            self._units = (self.store.generation, records, times)
        return self._units[1], self._units[2]

    def rank(self, questions: list[str], depth: int, mode: str, cfg: RetrievalConfig,
             qvec: np.ndarray | None = None, when: list[tuple[datetime | None, bool]] | None = None,
             ) -> list[Ranked]:
        """Best ``depth`` passages per question as ``(passage id, score, why)``; ``qvec``: the
        questions' embeddings when the caller has them already; ``when``: per question the as-of
        time (None = now) and whether it asks about the past, for facts stated in conversations."""
        if mode == "decompose":
            return [r.ranking for r in self._decompose(questions, depth, cfg)]
        if mode == "expand":
            return [e.ranking for e in self._expand(questions, depth, cfg)]
        if mode == "bm25":
            return self._rank_bm25(questions, depth, cfg)
        if mode == "hybrid":
            return self._rank_hybrid(questions, depth, cfg, when)
        if mode == "dense":
            if qvec is None:
                qvec = self._embedder().embed(questions)
            return dense_rankings(self.vectors, qvec, depth)
        return self._rank_graph(questions, depth, cfg, qvec, when)

    # ------------------------------------------------------------------ decompose and expand
    def decompose_many(self, questions: Sequence[str], k: int,
                       config: RetrievalConfig | None = None) -> list[DecomposedRetrieval]:
        """Decomposed constraint retrieval with its trace; ``hits`` hold the top ``k``."""
        validate_request(questions, k, "decompose")
        with _blas_threads(1):
            results = self._decompose(list(questions), k, config or self.config)
            for r, hits in zip(results, self.hits([r.ranking for r in results], k), strict=True):
                r.hits = hits
        return results

    def expand_many(self, questions: Sequence[str], k: int,
                    config: RetrievalConfig | None = None) -> list[Expansion]:
        """Dynamic KG expansion: per question the verified subgraph and the passages supporting it
        (``hits``, top ``k``); verified new facts are in ``new_facts`` (nothing is written)."""
        validate_request(questions, k, "expand")
        with _blas_threads(1):
            results = self._expand(list(questions), k, config or self.config)
            for r, hits in zip(results, self.hits([r.ranking for r in results], k), strict=True):
                r.hits = hits
        return results

    def _decompose(self, questions: list[str], depth: int, cfg: RetrievalConfig) -> list[DecomposedRetrieval]:
        from hipgraph.query.constraints import ConstraintRunner  # noqa: PLC0415

        return ConstraintRunner(self, self._decomposer(cfg), self._reader(cfg)).run(questions, depth, cfg)

    def _expand(self, questions: list[str], depth: int, cfg: RetrievalConfig) -> list[Expansion]:
        from hipgraph.query.expand import Expander  # noqa: PLC0415

        client = self._chat_client(cfg.llm) if cfg.llm is not None else None
        expander = Expander(self, self._embedder(), self.vectors, self.store, client)
        return expander.run(questions, depth, cfg)

    def _decomposer(self, cfg: RetrievalConfig):

        name = cfg.decompose.decomposer
        if name == "auto":
            name = "llm" if cfg.llm is not None else "rules"
        if name == "llm":
            if cfg.llm is None:
                raise ConfigError("decompose.decomposer='llm' needs RetrievalConfig.llm (an endpoint)")
            from hipgraph.query.llm_steps import LLMDecomposer  # noqa: PLC0415

            return LLMDecomposer(self._chat_client(cfg.llm), self._rules(cfg.decompose.max_steps))
        return self._rules(cfg.decompose.max_steps)

    def _rules(self, max_steps: int):
        from hipgraph.query.decompose import RuleDecomposer  # noqa: PLC0415

        if self._rule_decomposer is None or self._rule_decomposer.max_steps != max_steps:
            self._rule_decomposer = RuleDecomposer(self._spacy_model, max_steps)
        return self._rule_decomposer

    def _reader(self, cfg: RetrievalConfig):
        if cfg.llm is None or not cfg.decompose.llm_bridges:
            return None
        from hipgraph.query.llm_steps import StepReader  # noqa: PLC0415

        return StepReader(self._chat_client(cfg.llm))

    def _rank_bm25(self, questions: list[str], depth: int, cfg: RetrievalConfig) -> list[Ranked]:
        index = self._bm25_index(cfg)
        scores, ids = index.search(questions, depth)
        out: list[Ranked] = []
        for q in range(len(questions)):
            out.append([(int(i), float(s), {"mode": "bm25", "bm25": round(float(s), 6)})
                        for s, i in zip(scores[q], ids[q], strict=True) if i >= 0])
        return out

    def _rank_hybrid(self, questions: list[str], depth: int, cfg: RetrievalConfig,
                     when: list[tuple[datetime | None, bool]] | None = None) -> list[Ranked]:
        depth_each = max(depth, cfg.fusion_depth)
        # graph and dense share one embedding call: graph's (the questions with their unlinked
        # entity spans), whose question rows dense reuses
        done: dict[str, list[Ranked]] = {}
        qvec = None
        if "graph" in cfg.hybrid_modes:
            run = self.graph_run(questions, cfg, None, when)
            done["graph"], qvec = self.rank_run(run, depth_each, cfg.graph), run.qvec
        parts = {m: done[m] if m in done else self.rank(questions, depth_each, m, cfg, qvec, when)
                 for m in cfg.hybrid_modes}
        out: list[Ranked] = []
        for q in range(len(questions)):
            fused: dict[int, float] = {}
            ranks: dict[int, dict[str, int]] = {}
            for m, rankings in parts.items():
                for r, (pid, _, _) in enumerate(rankings[q], start=1):
                    fused[pid] = fused.get(pid, 0.0) + 1.0 / (cfg.rrf_k + r)
                    ranks.setdefault(pid, {})[m] = r
            best = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:depth]
            out.append([(pid, s, {"mode": "hybrid", "rrf": round(s, 6), "ranks": ranks[pid]})
                        for pid, s in best])
        return out

    # ------------------------------------------------------------------ graph mode
    def graph_run(self, questions: list[str], cfg_all: RetrievalConfig,
                  qvec: np.ndarray | None = None,
                  when: list[tuple[datetime | None, bool]] | None = None) -> GraphRun:
        """Seeds and PPR node scores of ``questions`` (one embedding call, one batched PPR);
        ``when`` weighs facts stated in conversations by whether they held (see :meth:`rank`)."""
        cfg = cfg_all.graph
        snap = self.snapshot()
        embedder = self._embedder()
        linked: list[dict[int, str]] = [{} for _ in questions]
        unmatched: list[tuple[int, str]] = []
        if cfg.link_question_entities and snap.n_entities:
            for q, pairs in enumerate(self._spans.link(questions, self.entity_names())):
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
            scores, ids = self.vectors.search("entity", svec, 1)
            idx = snap.entity_index(ids[:, 0])
            for (q, span), s, e in zip(unmatched, scores[:, 0], idx, strict=True):
                if e >= 0 and s >= cfg.link_threshold:
                    linked[q].setdefault(int(e), span)

        n_pass = max(1, min(snap.n_passages, cfg.passage_candidates))
        d_scores, d_ids = self.vectors.search("passage", qvec, n_pass)
        if snap.fact_ids.size:
            f_scores, f_ids = self.vectors.search("fact", qvec, min(cfg.fact_candidates, snap.fact_ids.size))
        else:
            f_scores = np.zeros((len(questions), 0), np.float32)
            f_ids = np.zeros((len(questions), 0), np.int64)
        fact_rows = [snap.fact_index(f_ids[q]) for q in range(len(questions))]
        fact_scores = [f_scores[q].astype(np.float64) for q in range(len(questions))]
        if when is not None:
            validity = self.fact_times()
            if validity:
                for q, (at, past) in enumerate(when):
                    fact_scores[q] = fact_scores[q] * fact_weights(
                        validity, f_ids[q], at, past, cfg_all.stale_fact_weight)
        filter_notes: list[str | None] = [None] * len(questions)
        threshold = None
        if self._fact_filter(cfg_all) is not None and cfg.fact_filter:
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

    def _rank_graph(self, questions: list[str], depth: int, cfg_all: RetrievalConfig,
                    qvec: np.ndarray | None = None,
                    when: list[tuple[datetime | None, bool]] | None = None) -> list[Ranked]:
        return self.rank_run(self.graph_run(questions, cfg_all, qvec, when), depth, cfg_all.graph)

    def fact_times(self) -> dict[int, FactTime]:
        """Validity of facts stated in conversations (read once per index generation)."""
        if self._fact_times is None or self._fact_times[0] != self.store.generation:
            starts = {pid: span[0] for pid, span in self._memory()[1].items()}
            self._fact_times = (self.store.generation, fact_times(self.store, starts))
        return self._fact_times[1]

    def rank_run(self, run: GraphRun, depth: int, cfg: GraphRetrievalConfig) -> list[Ranked]:
        """Best ``depth`` passages per question of a :meth:`graph_run` (dense when unseeded)."""
        snap = run.snapshot
        out: list[Ranked] = []
        dense_fallback = None
        for q in range(len(run.seeds)):
            if q not in run.rows:
                if dense_fallback is None:
                    dense_fallback = dense_rankings(self.vectors, run.qvec, depth)
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
                self._explain(snap, run.seeds[q], top, out[-1])
        return out

    def _fact_filter(self, cfg: RetrievalConfig) -> FactFilter | None:
        """The recognition-memory filter for ``cfg.llm`` (one client per endpoint config)."""
        if cfg.llm is None:
            return None
        if self._filter is None or self._filter.client.config != cfg.llm:
            self._filter = FactFilter(self._chat_client(cfg.llm))
        return self._filter

    def _filter_facts(self, snap: GraphSnapshot, questions: list[str], rows: list[np.ndarray],
                      scores: list[np.ndarray], cfg: GraphRetrievalConfig):
        """Let the LLM choose among each question's top ``fact_top_k`` facts."""
        tops = []
        for r, s in zip(rows, scores, strict=True):
            ok = r >= 0
            tops.append((r[ok][: cfg.fact_top_k], s[ok][: cfg.fact_top_k]))
        facts = self._facts_of([int(snap.fact_ids[i]) for r, _ in tops for i in r])
        candidates = []
        for r, _ in tops:
            triples = []
            for i in r:
                f = facts.get(int(snap.fact_ids[i]), {})
                triples.append((f.get("subject", ""), f.get("relation", ""), f.get("object", "")))
            candidates.append(triples)
        verdicts = self._filter.keep(questions, candidates)
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
                 ranked: Ranked) -> None:
        """Fill each hit's ``why`` with the question's seeds and its strongest seed path."""
        paths = [strongest_path(snap, seeds, node) for node, _ in top]
        p = snap.n_passages
        names = self.entity_names().by_id
        facts = self._facts_of([int(snap.fact_ids[r]) for r, _ in seeds.facts])
        seed_facts = [{"fact_id": int(snap.fact_ids[r]), **facts.get(int(snap.fact_ids[r]), {}),
                       "score": round(s, 6)} for r, s in seeds.facts]
        seed_entities = [{"entity_id": int(snap.entity_ids[e]), "name": names.get(int(snap.entity_ids[e]), ""),
                          "weight": round(w, 6), "via": "question" if e in seeds.linked else "fact"}
                         for e, w in sorted(seeds.entities.items(), key=lambda kv: (-kv[1], kv[0]))]
        for (pid, _score, why), (path, path_score) in zip(ranked, paths, strict=True):
            steps = []
            for n in path:
                if n >= p:
                    eid = int(snap.entity_ids[n - p])
                    steps.append({"entity_id": eid, "name": names.get(eid, "")})
                else:
                    steps.append({"passage_id": int(snap.passage_ids[n])})
            why.update({"seed_facts": seed_facts, "seed_entities": seed_entities,
                        "path": steps, "path_score": round(path_score, 8),
                        "dense_seed": round(seeds.passages.get(snap.passage_nodes(np.array([pid]))[0].item(), 0.0), 6)})

    def passage_texts(self, passage_ids: list[int]) -> list[tuple[str, str]]:
        """``(title, text)`` of each passage id still stored, in the order given."""
        rows = passage_rows(self.store, set(passage_ids))
        return [rows[i][1:] for i in passage_ids if i in rows]

    def _facts_of(self, fact_ids: list[int]) -> dict[int, dict[str, str]]:
        if not fact_ids:
            return {}
        names = self.entity_names().by_id
        rows = self.store.con.execute(
            f"SELECT id, subject_id, relation, object_id FROM facts WHERE id IN ({id_list(fact_ids)})").fetchall()
        return {int(i): {"subject": names.get(int(s), ""), "relation": r, "object": names.get(int(o), "")}
                for i, s, r, o in rows}
