"""Retrieval over one open index: ``graph`` (default), ``dense``, ``bm25``, ``hybrid``,
``decompose`` and ``expand``, chosen by name from one table (:data:`RANKERS`).

:class:`Retriever` is the read side's entry point. Each call holds the store's shared lock and
reads one :class:`~hipgraph.query.view.ReadView` (the current generation's snapshot, names,
memory units, BM25), so any number of threads may query one index while one thread writes: a
call sees the generation before a batch or after it. It never calls a generator.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from hipgraph.config import ChatConfig, RetrievalConfig
from hipgraph.errors import ConfigError
from hipgraph.models.base import Embedder
from hipgraph.models.chat import ChatClient
from hipgraph.query.dense import dense_rankings
from hipgraph.query.fact_filter import FactFilter
from hipgraph.query.graph_search import GraphSearch, When
from hipgraph.query.hits import Ranked, to_hits, turn_hits
from hipgraph.query.linking import EntityNames, QuestionSpans
from hipgraph.query.memory import apply_time, asks_about_past, parse_question_dates
from hipgraph.query.snapshot import GraphSnapshot
from hipgraph.query.turns import TurnWeights, rank_turns
from hipgraph.query.validity import FactTime, fact_weights
from hipgraph.query.view import ReadView, UnitTimes, Views
from hipgraph.store.database import GraphStore
from hipgraph.store.vector_set import VectorSet
from hipgraph.temporal import TimeRange, event_relative, parse_time, resolve_range
from hipgraph.text.limits import unicode_fault
from hipgraph.types import Hit

if TYPE_CHECKING:
    from hipgraph.query.constraints import DecomposedRetrieval
    from hipgraph.query.expand import Expansion

logger = logging.getLogger(__name__)

__all__ = ["MODES", "RANKERS", "Query", "Retriever", "validate_request"]


def validate_request(questions: Sequence[str], k: int, mode: str,
                     max_question_chars: int = RetrievalConfig.max_question_chars) -> None:
    """Errors for bad retrieval input, naming the offending value (a question longer than
    ``max_question_chars`` is refused, never truncated)."""
    if isinstance(questions, str):
        raise ConfigError("retrieve_many takes a list of questions, not one string")
    if mode not in RANKERS:
        raise ConfigError(f"unknown retrieval mode {mode!r}; available: {', '.join(MODES)}")
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ConfigError(f"k must be an integer >= 1, got {k!r}")
    for i, q in enumerate(questions):
        if not isinstance(q, str) or not q.strip():
            raise ConfigError(f"question {i} is empty" if isinstance(q, str)
                              else f"question {i} is not a string: {type(q).__name__}")
        if len(q) > max_question_chars:
            raise ConfigError(f"question {i} is {len(q)} characters long, over the limit of "
                              f"{max_question_chars} (RetrievalConfig.max_question_chars)")
        fault = unicode_fault(q)
        if fault:
            raise ConfigError(f"question {i} {fault}")


def _within_index(view: ReadView, k: int) -> int:
    """``k`` clamped to the passages ``view`` holds (at least 1): no ranking can be longer, and
    no search or array is sized by a request's ``k`` (``k = 10**9`` on ten passages costs what
    ``k = 10`` does)."""
    return max(1, min(int(k), view.passage_count()))


# the fewest tokens a memory turn takes in a context: "[n] 8 May 2023: Ana: Yes!" is 12 by the
# 1.3-per-word estimate; answer's default depth over memory is its budget over this
MIN_TURN_TOKENS = 8

_BLAS_LOCK = threading.Lock()
_blas_state: dict[str, Any] = {"depth": 0, "limiter": None}


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    """Hold numpy's BLAS (used by spaCy's parser) to one thread while queries run.

    OpenBLAS workers spin after each call; on a small machine they starve the embedder's torch
    threads that run next (a 64-question graph batch took 10.5 s instead of 0.5 s on 2 cores).
    The limit is process-wide, so concurrent queries share it: the first sets it, the last
    one out restores it.
    """
    controller = _threadpool_controller()
    if controller is None:
        yield
        return
    with _BLAS_LOCK:
        if _blas_state["depth"] == 0:
            _blas_state["limiter"] = controller.limit(limits=1, user_api="blas")
        _blas_state["depth"] += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _blas_state["depth"] -= 1
            if _blas_state["depth"] == 0:
                _blas_state["limiter"].restore_original_limits()
                _blas_state["limiter"] = None


@functools.cache
def _threadpool_controller():
    """One controller per process (building it scans the loaded libraries: ~1.5 ms)."""
    try:
        from threadpoolctl import ThreadpoolController  # noqa: PLC0415
    except ImportError:  # optional: without it queries are only slower on small machines
        return None
    return ThreadpoolController()




class BatchEmbedder:
    """An embedder that remembers the vectors of the texts it embedded (one query batch), and
    the spaCy parses of the batch's questions made before the read lock (``parsed``)."""

    def __init__(self, embedder: Embedder):
        self.inner = embedder
        self.name, self.dimension = embedder.name, embedder.dimension
        self._seen: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()
        self.parsed: dict[str, Any] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        with self._lock:
            todo = list(dict.fromkeys(t for t in texts if t not in self._seen))
        if todo:
            vectors = self.inner.embed(todo)
            with self._lock:
                self._seen.update(zip(todo, vectors, strict=True))
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        with self._lock:
            return np.stack([self._seen[t] for t in texts])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass(frozen=True)
class Query:
    """One batch being ranked: the view it reads, its graph search and the settings."""

    retriever: Retriever
    view: ReadView
    graph: GraphSearch
    cfg: RetrievalConfig
    when: When | None = None
    paths: int | None = None  # graph hits given their strongest seed path (None: all)


#: A call of this many questions (one: ``retrieve``) embeds them beside their spaCy parse, its
#: unmatched spans after (:meth:`Retriever.prepare`); a batch embeds questions and spans in one
#: call after the parse, on all cores.
OVERLAP_QUESTIONS = 1

Ranker = Callable[[Query, list[str], int], list[Ranked]]


def _rank_graph(q: Query, questions: list[str], depth: int) -> list[Ranked]:
    return q.graph.rank_run(q.graph.graph_run(questions, q.cfg, None, q.when), depth, q.cfg.graph,
                            q.paths)


def _rank_dense(q: Query, questions: list[str], depth: int, qvec: np.ndarray | None = None) -> list[Ranked]:
    if qvec is None:
        qvec = q.graph.embedder.embed(questions)
    return dense_rankings(q.view.vectors, qvec, depth)


def _rank_bm25(q: Query, questions: list[str], depth: int) -> list[Ranked]:
    scores, ids = q.view.bm25(q.cfg.bm25_k1, q.cfg.bm25_b).search(questions, depth)
    return [[(int(i), float(s), {"mode": "bm25", "bm25": round(float(s), 6)})
             for s, i in zip(scores[row], ids[row], strict=True) if i >= 0]
            for row in range(len(questions))]


def _rank_hybrid(q: Query, questions: list[str], depth: int) -> list[Ranked]:
    """Reciprocal-rank fusion of ``cfg.hybrid_modes``; graph and dense share one embedding call
    (graph's: the questions with their unlinked entity spans, whose question rows dense reuses)."""
    cfg = q.cfg
    depth_each = max(depth, cfg.fusion_depth)
    parts: dict[str, list[Ranked]] = {}
    qvec = None
    if "graph" in cfg.hybrid_modes:
        # fused hits carry ranks, not paths: explaining depth_each graph hits (100 strongest
        # paths a question) tripled hybrid's time for nothing
        graph_cfg = replace(cfg.graph, explain=False)
        run = q.graph.graph_run(questions, cfg, None, q.when)
        parts["graph"], qvec = q.graph.rank_run(run, depth_each, graph_cfg), run.qvec
    for m in cfg.hybrid_modes:
        if m not in parts:
            parts[m] = (_rank_dense(q, questions, depth_each, qvec) if m == "dense"
                        else RANKERS[m](q, questions, depth_each))
    parts = {m: parts[m] for m in cfg.hybrid_modes}
    out: list[Ranked] = []
    for row in range(len(questions)):
        fused: dict[int, float] = {}
        ranks: dict[int, dict[str, int]] = {}
        for m, rankings in parts.items():
            for r, (pid, _, _) in enumerate(rankings[row], start=1):
                fused[pid] = fused.get(pid, 0.0) + 1.0 / (cfg.rrf_k + r)
                ranks.setdefault(pid, {})[m] = r
        best = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:depth]
        out.append([(pid, s, {"mode": "hybrid", "rrf": round(s, 6), "ranks": ranks[pid]})
                    for pid, s in best])
    return out


def _rank_decompose(q: Query, questions: list[str], depth: int) -> list[Ranked]:
    return [r.ranking for r in q.retriever.run_decompose(q, questions, depth)]


def _rank_expand(q: Query, questions: list[str], depth: int) -> list[Ranked]:
    return [e.ranking for e in q.retriever.run_expand(q, questions, depth)]


#: Retrieval modes by name, in the order the CLI and errors list them.
RANKERS: dict[str, Ranker] = {
    "graph": _rank_graph,
    "dense": _rank_dense,
    "bm25": _rank_bm25,
    "hybrid": _rank_hybrid,
    "decompose": _rank_decompose,
    "expand": _rank_expand,
}
MODES = tuple(RANKERS)


class Retriever:
    """The read side of one index (see module docstring)."""

    def __init__(self, store: GraphStore, vectors: VectorSet, embedder: Callable[[], Embedder],
                 spacy_model: str, config: RetrievalConfig,
                 chat_client: Callable[[ChatConfig], ChatClient] = ChatClient):
        self.store = store
        self.vectors = vectors
        self.views = Views(store, vectors)
        self._chat_client = chat_client  # shared with the generator by the owning HipGraph
        self._embedder = embedder
        self.config = config
        self._spans = QuestionSpans(spacy_model)
        self._spacy_model = spacy_model
        self._lock = threading.Lock()  # guards the helpers made on first use below
        self._rule_decomposer = None
        self._filter: FactFilter | None = None
        self._helpers: ThreadPoolExecutor | None = None  # embeds questions beside their parse

    # ------------------------------------------------------------------ reading
    @contextlib.contextmanager
    def reading(self) -> Iterator[ReadView]:
        """Hold the store's shared lock and yield the current generation's view."""
        with self.store.lock.shared(), _one_blas_thread():
            yield self.views.current()

    def query(self, view: ReadView, cfg: RetrievalConfig, when: When | None = None,
              paths: int | None = None, embedder: BatchEmbedder | None = None) -> Query:
        """One batch's query state; its embedder keeps the batch's vectors, so a question the
        mode embedded is not embedded again (turn scoring, event lookups)."""
        embedder = embedder or BatchEmbedder(self._embedder())
        graph = GraphSearch(view, embedder, self._spans, self._fact_filter(cfg))
        return Query(self, view, graph, cfg, when, paths)

    def prepare(self, questions: list[str], mode: str, cfg: RetrievalConfig) -> BatchEmbedder:
        """The work on ``questions`` alone, done before the read lock is taken (so a write's
        commit does not wait for it, and a read waiting for a commit gets it done meanwhile):
        the spaCy parse and one embedding call for the questions and their entity spans, both
        kept by the returned embedder, which the query then uses. Graph, dense and hybrid
        retrieval; other modes embed under the lock as before."""
        embedder = BatchEmbedder(self._embedder())
        if mode not in ("graph", "dense", "hybrid"):
            return embedder
        texts = list(questions)
        with _one_blas_thread():
            if mode != "dense" and cfg.graph.link_question_entities:
                # a lone question embeds on a helper thread while spaCy parses it here (both
                # release the GIL for most of their work, so the two overlap on two cores)
                # (its own copy of the list: ``texts`` grows by the spans below while the helper
                # may not have read it yet, and a question batched with its spans moved in its
                # last bits with their padding, so one question gave two vectors)
                embedding = (self._beside(embedder.embed, list(texts))
                             if len(texts) <= OVERLAP_QUESTIONS else None)
                # the spans graph retrieval will embed: those no name matches, by the names the
                # latest view holds (a guess made without the lock: a span it gets wrong is
                # embedded under the lock, or embedded for nothing)
                names = self.views.built_names()
                embedder.parsed = dict(zip(questions, self._spans.parse(questions), strict=True))
                texts += [span for pairs in self._spans.link(questions, names, parsed=embedder.parsed)
                          for span, eid in pairs if eid is None]
                if embedding is not None:
                    embedding.result()  # the questions' vectors, kept by the embedder (or its error)
            embedder.embed(texts)  # what is not embedded yet: all, or the unmatched spans
        return embedder

    def _beside(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` on the retriever's helper threads (made on first use)."""
        with self._lock:
            if self._helpers is None:
                self._helpers = ThreadPoolExecutor(thread_name_prefix="hipgraph-query")  # min(32, cores + 4)
            helpers = self._helpers
        return helpers.submit(fn, *args)

    def snapshot(self) -> GraphSnapshot:
        """The current generation's graph snapshot."""
        with self.reading() as view:
            return view.snapshot()

    def entity_names(self) -> EntityNames:
        with self.reading() as view:
            return view.entity_names()

    def fact_times(self) -> dict[int, FactTime]:
        """Validity of facts stated in conversations (current generation)."""
        with self.reading() as view:
            return view.fact_times()

    def close(self) -> None:
        self._filter = None  # its client belongs to whoever made it (the HipGraph)
        with self._lock:
            helpers, self._helpers = self._helpers, None
        if helpers is not None:
            helpers.shutdown(wait=True)
        try:
            with self.store.lock.shared():
                self.views.save_caches()
        except Exception as exc:  # noqa: BLE001 - a cache not written is rebuilt on the next open
            logger.warning("graph snapshot cache not written on close (%s)", exc)

    # ------------------------------------------------------------------ entry points
    def retrieve_many(self, questions: Sequence[str], k: int, mode: str,
                      config: RetrievalConfig | None = None, question_dates: Sequence[Any] | None = None,
                      as_of: Any = None) -> list[list[Hit]]:
        cfg = config or self.config
        validate_request(questions, k, mode, cfg.max_question_chars)
        questions = list(questions)
        if not questions:
            return []
        dates = parse_question_dates(question_dates, len(questions), parse_time)
        as_of_t = parse_time(as_of, where="as_of") if as_of is not None else None
        embedder = self.prepare(questions, mode, cfg)
        with self.reading() as view:
            units, times = view.memory_units()
            if not units:
                k = _within_index(view, k)
                return to_hits(view, RANKERS[mode](self.query(view, cfg, embedder=embedder), questions, k),
                               k, units)
            # conversation memory: time expressions, facts weighed by when they held, as_of
            spans = [resolve_range(q, d or as_of_t) for q, d in zip(questions, dates, strict=True)]
            when = [(as_of_t, asks_about_past(q, span, d or as_of_t))
                    for q, span, d in zip(questions, spans, dates, strict=True)]
            # the units past the first k are candidates (for time ranking, turns): their
            # strongest graph paths are not worked out
            query = self.query(view, cfg, when, paths=k, embedder=embedder)
            depth = _within_index(view, max(k, cfg.memory_candidates))
            rankings = RANKERS[mode](query, questions, depth)
            self._event_spans(query, questions, spans, times)
            rankings = [apply_time(r, times, span, as_of_t, cfg.time_mode)
                        for r, span in zip(rankings, spans, strict=True)]
            if cfg.memory_hits == "unit":
                return to_hits(view, rankings, min(k, depth), units)
            return self._turn_hits(query, questions, rankings, k, as_of_t)

    def _turn_hits(self, q: Query, questions: list[str], rankings: list[Ranked], k: int,
                   as_of: Any) -> list[list[Hit]]:
        """The best ``k`` turns of each question's ranked memory units (:mod:`hipgraph.query.turns`)."""
        view, cfg = q.view, q.cfg
        turns = view.memory_turns()
        k = max(1, min(int(k), len(turns) + view.passage_count() - len(turns.by_unit)))
        embedder = q.graph.embedder
        weights = TurnWeights(cfg.turn_units, cfg.turn_rank_weight, cfg.turn_bm25_weight)
        qvecs = embedder.embed(questions)
        picked = rank_turns(
            rankings, questions, qvecs, turns,
            lambda rows, pids: view.turn_vectors(rows, pids, embedder.embed),
            lambda qs: view.turn_bm25(cfg.bm25_k1, cfg.bm25_b).scores_all(qs), weights, k, as_of,
            self._stale_objects(q, qvecs), cfg.stale_fact_weight)
        return turn_hits(view, picked, turns, view.memory_units()[0])

    def _stale_objects(self, q: Query, qvecs: np.ndarray) -> list[dict[int, set[str]]] | None:
        """Per question: unit -> objects of the replaced facts among its ``graph.fact_top_k``
        best-matching facts that the unit states (none for a question about the past)."""
        if q.when is None or not q.view.has_replaced_facts():
            return None
        validity = q.view.fact_times()
        _, f_ids = q.view.search("fact", qvecs, q.cfg.graph.fact_top_k)
        stale_ids: list[set[int]] = []
        for row, (at, past) in zip(f_ids, q.when, strict=True):
            ids = row[row >= 0]
            marks = fact_weights(validity, ids, at, past, -1.0)  # -1 marks a replaced fact
            stale_ids.append({int(f) for f, x in zip(ids.tolist(), marks, strict=True) if x < 0})
        every = set().union(*stale_ids)
        if not every:
            return None
        objects = {f: t["object"] for f, t in q.view.facts_of(every).items()}
        sources = q.view.fact_sources(every)
        out: list[dict[int, set[str]]] = []
        for ids in stale_ids:
            by_unit: dict[int, set[str]] = {}
            for f in ids:
                for pid in sources.get(f, []):
                    by_unit.setdefault(pid, set()).add(objects.get(f, ""))
            out.append(by_unit)
        return out

    def context_depth(self, context_tokens: int, config: RetrievalConfig | None = None) -> int:
        """How many hits ``answer`` retrieves by default: 5 passages, or over conversation memory
        with turn hits enough turns to fill ``context_tokens`` (a turn with its head costs at
        least :data:`MIN_TURN_TOKENS` tokens)."""
        cfg = config or self.config
        with self.reading() as view:
            if cfg.memory_hits != "turn" or not view.memory_units()[0]:
                return 5
        return max(5, context_tokens // MIN_TURN_TOKENS)

    def decompose_many(self, questions: Sequence[str], k: int,
                       config: RetrievalConfig | None = None) -> list[DecomposedRetrieval]:
        """Decomposed constraint retrieval with its trace; ``hits`` hold the top ``k``."""
        return self._traced(questions, k, config, "decompose", self.run_decompose)

    def expand_many(self, questions: Sequence[str], k: int,
                    config: RetrievalConfig | None = None) -> list[Expansion]:
        """Dynamic KG expansion: per question the verified subgraph and the passages supporting it
        (``hits``, top ``k``). It only reads; persisting new facts is the indexer's job."""
        return self._traced(questions, k, config, "expand", self.run_expand)

    def _traced(self, questions: Sequence[str], k: int, config: RetrievalConfig | None, mode: str,
                run: Callable[[Query, list[str], int], list[Any]]) -> list[Any]:
        """A mode's full results (with their traces), each given its top ``k`` as ``hits``."""
        cfg = config or self.config
        validate_request(questions, k, mode, cfg.max_question_chars)
        with self.reading() as view:
            k = _within_index(view, k)
            results = run(self.query(view, cfg), list(questions), k)
            hits = to_hits(view, [r.ranking for r in results], k, view.memory_units()[0])
        for r, h in zip(results, hits, strict=True):
            r.hits = h
        return results

    # ------------------------------------------------------------------ modes that compose
    def run_decompose(self, q: Query, questions: list[str], depth: int) -> list[DecomposedRetrieval]:
        from hipgraph.query.constraints import ConstraintRunner  # noqa: PLC0415

        return ConstraintRunner(q.graph, self._decomposer(q.cfg), self._reader(q.cfg)).run(
            questions, depth, q.cfg)

    def run_expand(self, q: Query, questions: list[str], depth: int) -> list[Expansion]:
        from hipgraph.query.expand import Expander  # noqa: PLC0415

        client = self._chat_client(q.cfg.llm) if q.cfg.llm is not None else None
        return Expander(q.graph, q.graph.embedder, q.view.vectors, q.view.store, client).run(
            questions, depth, q.cfg)

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

        with self._lock:
            if self._rule_decomposer is None or self._rule_decomposer.max_steps != max_steps:
                self._rule_decomposer = RuleDecomposer(self._spacy_model, max_steps)
            return self._rule_decomposer

    def _reader(self, cfg: RetrievalConfig):
        if cfg.llm is None or not cfg.decompose.llm_bridges:
            return None
        from hipgraph.query.llm_steps import StepReader  # noqa: PLC0415

        return StepReader(self._chat_client(cfg.llm))

    def _fact_filter(self, cfg: RetrievalConfig) -> FactFilter | None:
        """The recognition-memory filter for ``cfg.llm`` (one client per endpoint config)."""
        if cfg.llm is None:
            return None
        with self._lock:
            if self._filter is None or self._filter.client.config != cfg.llm:
                self._filter = FactFilter(self._chat_client(cfg.llm))
            return self._filter

    # ------------------------------------------------------------------ conversation memory
    def _event_spans(self, q: Query, questions: list[str], spans: list[TimeRange | None],
                     times: UnitTimes) -> None:
        """Fill the spans of questions anchored on an event ("two weeks before the trip"): the
        event (with the question's names) is looked up among the memory units by embedding, and
        the best unit's time anchors the range."""
        todo = [(i, ev) for i, (qn, span) in enumerate(zip(questions, spans, strict=True))
                if span is None and (ev := event_relative(qn)) is not None]
        if not todo:
            return
        names = [" ".join(re.findall(r"\b[A-Z][\w'-]+", questions[i][1:])) for i, _ in todo]
        vecs = q.graph.embedder.embed([f"{n} {ev.event}".strip() for (_, ev), n in zip(todo, names, strict=True)])
        _, ids = q.view.search("passage", vecs, 10)
        for (i, ev), row in zip(todo, ids, strict=True):
            anchor = next((times[int(p)][0] for p in row if int(p) in times), None)
            if anchor is not None:
                spans[i] = ev.resolve(anchor)
