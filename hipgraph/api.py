"""The user-facing handle of one index: :func:`open` returns a :class:`HipGraph`."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hipgraph import registry
from hipgraph.config import (
    EMBEDDERS_NEEDING_SESSION,
    EXTRACTORS_NEEDING_SESSION,
    ChatConfig,
    ConversationConfig,
    EmbedderConfig,
    ExtractorConfig,
    GeneratorConfig,
    IndexConfig,
    RetrievalConfig,
    strip_session_fields,
)
from hipgraph.errors import ConfigError, SessionConfigError, StoreError
from hipgraph.indexers.extract_base import Extractor
from hipgraph.indexers.pipeline import Indexer, Progress, release_freed_memory
from hipgraph.models.base import Embedder
from hipgraph.models.chat import ChatClient
from hipgraph.query.engine import MODES, Retriever
from hipgraph.reopen import check_same_embedder, extractor_message, remote_embedder_message
from hipgraph.store import reads
from hipgraph.store.database import GraphStore
from hipgraph.store.llm_cache import DuckDBResponseCache
from hipgraph.store.vector_set import VectorSet
from hipgraph.types import (
    Answer,
    Conversation,
    Document,
    Fact,
    Hit,
    IndexReport,
    LearnedFact,
    Stats,
)

if TYPE_CHECKING:
    from hipgraph.query.expand import Expansion

logger = logging.getLogger(__name__)

RETRIEVAL_MODES = MODES
# config parts an existing index keeps (extractor, vectors and batch_size may change per session)
_GRAPH_DEFINING = ("chunk", "synonyms")


def open(  # noqa: A001 - the package's entry point, used as hipgraph.open(...)
    path: str | Path,
    *,
    create: bool = False,
    read_only: bool = False,
    config: IndexConfig | None = None,
    extractor: ExtractorConfig | None = None,
    embedder: Embedder | EmbedderConfig | None = None,
    retrieval: RetrievalConfig | None = None,
) -> HipGraph:
    """Open the index folder ``path`` (``create=True`` makes it when absent).

    A new index saves ``config`` (defaults otherwise) and the resolved backend names; reopening
    restores them, except endpoints, API key variables and file paths, which an index never
    records or supplies (:data:`~hipgraph.config.SESSION_ONLY_FIELDS`): an index built with the
    ``openai`` embedder reopens only with ``embedder=EmbedderConfig(name="openai", base_url=...,
    model=...)`` (or ``config=``) naming the same model, else :class:`SessionConfigError`.
    ``extractor`` overrides the saved extractor for this session's writes (each fact records which
    extractor produced it); writes to an index built with the ``llm`` or ``precomputed`` extractor
    need it. ``embedder`` passes a ready backend instance, or an :class:`EmbedderConfig`; either
    must match the one the index was built with. ``retrieval`` sets this session's query-time
    defaults (not saved with the index).
    """
    return HipGraph(Path(path), create=create, read_only=read_only, config=config,
                    extractor=extractor, embedder=embedder, retrieval=retrieval)


class HipGraph:
    """One open index: add/delete documents, statistics, retrieval."""

    def __init__(self, path: Path, *, create: bool, read_only: bool, config: IndexConfig | None,
                 extractor: ExtractorConfig | None, embedder: Embedder | EmbedderConfig | None,
                 retrieval: RetrievalConfig | None = None):
        self.path = path
        self.retrieval = retrieval or RetrievalConfig()
        embedder_config = embedder if isinstance(embedder, EmbedderConfig) else None
        self.config = (config or IndexConfig()).replace(
            **({"extractor": extractor} if extractor is not None else {}),
            **({"embedder": embedder_config} if embedder_config is not None else {}))
        self._embedder = None if embedder_config is not None else embedder
        self._built_embedder: str | None = None  # reopened: the embedder name the index was built with
        self._extractor_missing: str | None = None  # why this session cannot extract (writes)
        self._lazy = threading.RLock()  # backends and sides made on first use, once

        def new_schema() -> tuple[int, dict[str, Any]]:
            emb = self.embedder
            return emb.dimension, {"config": self.config.saved_form(), "embedder": emb.name,
                                   "extractor": self.config.extractor.name}

        self.store = GraphStore.open(path, create=create, read_only=read_only, new_schema=new_schema)
        if not self.store.created:
            try:
                self._adopt_saved_config(config, extractor, embedder)
            except BaseException:
                self.store.close()
                raise
        try:
            self.vectors = VectorSet(self.store, self.config.vectors).open()
        except BaseException:
            self.store.close()
            raise
        self._indexer: Indexer | None = None
        self._retriever: Retriever | None = None
        self._generators: dict[GeneratorConfig, Any] = {}
        self._chat_clients: dict[ChatConfig, ChatClient] = {}

    def _adopt_saved_config(self, config: IndexConfig | None, extractor: ExtractorConfig | None,
                            embedder: Embedder | EmbedderConfig | None) -> None:
        """Reopening: the saved config wins; a given one may differ only in per-session parts.

        Endpoints, key variables and paths are never taken from the index (whatever its meta
        holds): they come from ``config``, ``embedder`` or ``extractor`` of this session.
        """
        saved_data = strip_session_fields(self.store.meta_get("config"))
        built = self._built_embedder = self.store.meta_get("embedder")
        path = self.path
        session_embedder = (embedder if isinstance(embedder, EmbedderConfig)
                            else config.embedder if config is not None else None)
        instance = None if isinstance(embedder, EmbedderConfig) else embedder
        saved_embedder = dict(saved_data.get("embedder") or {})
        if session_embedder is not None:
            session_embedder = check_same_embedder(path, built, saved_embedder, session_embedder,
                                                    int(self.store.meta_get("dimension")))
            saved_data["embedder"] = dataclasses.asdict(session_embedder)
        elif saved_embedder.get("name") in EMBEDDERS_NEEDING_SESSION:
            instance_config = getattr(instance, "config", None)
            if not isinstance(instance_config, EmbedderConfig):
                raise SessionConfigError(remote_embedder_message(path, built, saved_embedder))
            saved_data["embedder"] = dataclasses.asdict(check_same_embedder(
                path, built, saved_embedder, instance_config, int(self.store.meta_get("dimension"))))
        saved_extractor = dict(saved_data.get("extractor") or {})
        needs = EXTRACTORS_NEEDING_SESSION.get(saved_extractor.get("name", ""))
        if needs is not None:  # the session's extractor, if any, replaces it below
            self._extractor_missing = extractor_message(path, saved_extractor["name"])
            saved_data["extractor"] = {**saved_extractor, "name": "spacy"}
        saved = IndexConfig.from_dict(saved_data)
        for part in _GRAPH_DEFINING:  # these shape the stored graph: changing them mid-index
            if config is not None and getattr(config, part) != getattr(saved, part):
                raise ConfigError(
                    f"index {path} was built with {part} = {getattr(saved, part)}; "
                    f"it cannot be reopened with {getattr(config, part)} (rebuild the index)")
        if instance is not None and instance.name != built:
            raise ConfigError(f"index {path} was built with embedder {built!r}, not {instance.name!r}")
        if config is not None:
            self.config = config.replace(embedder=saved.embedder)
            self._extractor_missing = None  # the session's config names its extractor
        else:
            self.config = saved
        if extractor is not None:
            self.config = self.config.replace(extractor=extractor)
            self._extractor_missing = None

    # ------------------------------------------------------------------ backends
    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            with self._lazy:
                if self._embedder is None:
                    made = registry.create("embedder", self.config.embedder.name, self.config.embedder)
                    if self._built_embedder is not None and made.name != self._built_embedder:
                        raise SessionConfigError(
                            f"index {self.path} was built with embedder {self._built_embedder!r}, "
                            f"this session's embedder config gives {made.name!r}; model folders "
                            "are not read from an index folder: pass hipgraph.open(path, "
                            "embedder=EmbedderConfig(model_path=FOLDER, ...)) to reopen it")
                    self._embedder = made
        return self._embedder

    def _require_extractor(self) -> None:
        if self._extractor_missing is not None:
            raise SessionConfigError(self._extractor_missing)

    def _make_extractor(self) -> Extractor:
        self._require_extractor()
        cfg = self.config.extractor
        if cfg.name == "llm":
            return registry.create("extractor", "llm", cfg, cache=DuckDBResponseCache(self.store))
        return registry.create("extractor", cfg.name, cfg)

    @property
    def indexer(self) -> Indexer:
        if self._indexer is None:
            with self._lazy:
                if self._indexer is None:
                    self._indexer = Indexer(self.store, self.vectors, self.embedder,
                                            self._make_extractor, self.config)
        return self._indexer

    # ------------------------------------------------------------------ writing
    def add_documents(
        self,
        documents: Iterable[Document | Mapping[str, Any]],
        *,
        progress: Progress | None = None,
        batch_size: int | None = None,
        executor: str = "local",
        workers: int | None = None,
        ray_address: str | None = None,
    ) -> IndexReport:
        """Add documents (``{"id", "text", "title"?, "metadata"?}`` or :class:`Document`).

        Idempotent per id: the same content is a no-op, changed content replaces the old version.
        Each batch commits atomically: ``batch_size`` documents when given, else batches that
        start at ``config.batch_size`` and grow with the index (``config.batch_growth`` of the
        documents it holds, at most ``config.max_batch_size``). ``documents`` is read as a
        stream. The per-document work (chunking, extraction, embedding) runs on ``executor``:
        ``local`` (this process; with ``workers=N``, N worker processes) or ``ray`` (Ray Data on
        the cluster at ``ray_address``, or a local one with ``workers`` CPUs); the index comes out
        the same either way.
        """
        if self.store.read_only:
            raise StoreError(f"index {self.path} is open read-only")
        self._require_extractor()
        runner = None
        if executor != "local" or workers or ray_address:
            from hipgraph.indexers.executors import create_executor  # noqa: PLC0415

            runner = create_executor(executor, self.config, dimension=self.vectors.dimension, workers=workers,
                                     address=ray_address)
        try:
            report = self.indexer.add_documents(documents, progress=progress, batch_size=batch_size,
                                                executor=runner)
        finally:
            if runner is not None:
                runner.close()
        if report.added or report.replaced:
            with self.store.writing():
                self.store.meta_set("extractor", self.indexer.extractor.name)
        return report

    def add_conversation(self, conversation: Conversation | Mapping[str, Any], *,
                         config: ConversationConfig | None = None, llm: ChatConfig | None = None,
                         progress: Progress | None = None, dayfirst: bool | None = None,
                         date_format: str | None = None, **run: Any) -> IndexReport:
        """Remember a conversation: ``{"id", "speakers"?, "sessions": [{"id", "time", "turns":
        [{"speaker", "text", "id"?, "time"?}]}]}`` or a :class:`Conversation`.

        Each session is stored as the document ``<id>#<session id>``, cut into memory units
        (topical segments by default; ``config`` overrides the index's
        :class:`ConversationConfig`); re-adding an unchanged session is a no-op, a new session is
        added, a changed one replaced. Hits from it carry ``turn_ids``, ``session`` and ``time``.
        With ``llm`` (an endpoint), the model places the topical segment boundaries (prompt
        ``segment``); a session it cannot segment falls back to embeddings, noted in the report.
        Numeric dates (``01.02.2024``) are read day-first or month-first as decided from all the
        conversation's dates unless ``dayfirst`` says which; ``date_format`` (``strptime``) reads
        every time in exactly that format. A session dated before the one listed above it is noted
        in the report's warnings.
        """
        return self.add_conversations([conversation], config=config, llm=llm, progress=progress,
                                      dayfirst=dayfirst, date_format=date_format, **run)

    def add_conversations(self, conversations: Iterable[Conversation | Mapping[str, Any]], *,
                          config: ConversationConfig | None = None, llm: ChatConfig | None = None,
                          progress: Progress | None = None, dayfirst: bool | None = None,
                          date_format: str | None = None, **run: Any) -> IndexReport:
        """:meth:`add_conversation` for many (one segmentation embedding call, batched writes);
        ``run`` takes :meth:`add_documents`' ``executor``, ``workers`` and ``ray_address``."""
        from hipgraph.indexers.conversations import (  # noqa: PLC0415
            DateOrder,
            conversation_documents,
            session_order_warnings,
            to_conversation,
        )

        if self.store.read_only:
            raise StoreError(f"index {self.path} is open read-only")
        self._require_extractor()
        dates = DateOrder(dayfirst=dayfirst, date_format=date_format)
        convs = [to_conversation(c, f"conversations[{i}]", dates) for i, c in enumerate(conversations)]
        warnings = [line for conv in convs for line in session_order_warnings(conv)]
        docs = conversation_documents(convs, self.embedder, config or self.config.conversation,
                                      llm=self.chat_client(llm) if llm is not None else None,
                                      warnings=warnings)
        report = self.add_documents(docs, progress=progress, **run)
        report.warnings[:0] = warnings
        return report

    def delete_conversation(self, conversation_id: str, session_ids: Sequence[str] | None = None) -> IndexReport:
        """Forget a conversation, or only its sessions ``session_ids``: what only they produced
        (units, facts, entities, edges, vectors) goes; facts other sessions also state stay."""
        from hipgraph.text.memory_units import session_key  # noqa: PLC0415

        if session_ids is not None:
            if isinstance(session_ids, str):
                raise ConfigError("session_ids takes a list of ids, not one string")
            keys = [session_key(conversation_id, s) for s in session_ids]
        else:
            keys = reads.document_keys_with_prefix(self.store, f"{conversation_id}#")
        return self.delete_documents(keys)

    def delete_documents(self, ids: Sequence[str]) -> IndexReport:
        """Delete documents with their passages, facts, orphaned entities, edges and vectors."""
        if isinstance(ids, str):
            raise ConfigError("delete_documents takes a list of ids, not one string")
        return self.indexer.delete_documents(list(ids))

    def save_vectors_every(self, seconds: float) -> None:
        """Write the FAISS files at most every ``seconds`` at the end of write calls (0, the
        default: after every call), and at :meth:`flush` and :meth:`close`: for many small writes
        (a server). DuckDB still commits each write; after a crash the next open brings older
        FAISS files up to date from DuckDB, so a deferred save loses nothing."""
        if not seconds >= 0:
            raise ConfigError(f"seconds must be >= 0, got {seconds!r}")
        self.vectors.save_every = float(seconds)

    def flush(self) -> None:
        """Write the FAISS files changed since their last save (waits for a write in flight)."""
        vectors = getattr(self, "vectors", None)
        if self.store is None or self.store.read_only or self.store.closed or not (vectors and vectors.dirty):
            return
        with self.store.writing():
            self.vectors.save()

    # ------------------------------------------------------------------ reading
    def stats(self) -> dict[str, Any]:
        """Counts: documents, passages, entities, facts and edges by type (one generation)."""
        with self.store.lock.shared():
            return Stats(self.store.stats())

    def document(self, id: str) -> dict[str, Any] | None:  # noqa: A002 - the document's own name
        """The stored document ``id`` (title, metadata, when added, and its passages with their
        character offsets into the text it was added with), or None when absent."""
        if not isinstance(id, str):
            raise ConfigError(f"document id must be a string, got {type(id).__name__}")
        with self.store.lock.shared():
            return reads.document_by_key(self.store, id)

    def to_networkx(self, question: str | None = None, *, entities: Sequence[str] | None = None,
                    hops: int = 1, k: int = 5, max_nodes: int = 300, config: RetrievalConfig | None = None):
        """The graph as a ``networkx.Graph``: whole (no arguments), the ``hops``-neighbourhood of
        named ``entities``, or a ``question``'s PPR subgraph (its seeds, top-``k`` passages and
        their strongest paths, then the highest-mass nodes up to ``max_nodes``), with node
        attributes ``kind``, ``label``, ``ppr``, ``seed``, ``retrieved`` and edge ``type``,
        ``weight``, ``on_path`` (see :mod:`hipgraph.query.export`)."""
        from hipgraph.query.export import to_networkx  # noqa: PLC0415

        return to_networkx(self._graph_view(question, entities, hops, k, max_nodes, config))

    def subgraph(self, question: str | None = None, *, entities: Sequence[str] | None = None,
                 hops: int = 1, k: int = 5, max_nodes: int = 300,
                 config: RetrievalConfig | None = None) -> dict[str, Any]:
        """:meth:`to_networkx`'s graph as plain JSON: ``{"nodes": [{"id", ...attributes}],
        "edges": [{"source", "target", ...attributes}]}`` (needs no graph library)."""
        view = self._graph_view(question, entities, hops, k, max_nodes, config)
        return {"nodes": [{"id": key, **attrs} for key, attrs in view.nodes.items()],
                "edges": [{"source": a, "target": b, **attrs} for a, b, attrs in view.edges]}

    def to_igraph(self, question: str | None = None, *, entities: Sequence[str] | None = None,
                  hops: int = 1, k: int = 5, max_nodes: int = 300, config: RetrievalConfig | None = None):
        """:meth:`to_networkx` as an ``igraph.Graph`` (node keys in the ``name`` attribute)."""
        from hipgraph.query.export import to_igraph  # noqa: PLC0415

        return to_igraph(self._graph_view(question, entities, hops, k, max_nodes, config))

    def _graph_view(self, question, entities, hops, k, max_nodes, config):
        from hipgraph.query.export import graph_view  # noqa: PLC0415

        cfg = config or self.retrieval
        with self.retriever.reading() as view:
            graph = self.retriever.query(view, cfg).graph
            return graph_view(graph, cfg, question, entities, hops, k, max_nodes)

    def facts(self, entity: str | None = None, *, as_of: Any = None, current_only: bool = False) -> list[Fact]:
        """Stored facts (subject, relation, object), those about ``entity`` (its name, any case)
        when given, with their passages and - for facts stated in conversations - ``valid_at``,
        ``invalid_at`` and ``invalidated_by``. ``as_of`` leaves out facts stated later;
        ``current_only`` keeps those that still held then (or now). Ordered by time, then id."""
        from hipgraph.query.validity import FactTime  # noqa: PLC0415
        from hipgraph.temporal import parse_time  # noqa: PLC0415
        from hipgraph.text.normalize import normalize_entity  # noqa: PLC0415

        when = parse_time(as_of, where="as_of") if as_of is not None else None
        with self.retriever.reading() as view:
            rows = reads.triple_facts(self.store, None if entity is None else normalize_entity(entity))
            times = view.fact_times()
        out = []
        for fid, sid, subj, rel, oid, obj, pids in rows:
            t = times.get(int(fid), FactTime(int(fid), None)).as_of(when)
            if t is None or (current_only and not t.valid(when)):
                continue  # not stated yet at ``as_of``, or replaced
            out.append(Fact(int(fid), int(sid), subj, rel, int(oid), obj, tuple(int(p) for p in pids),
                            t.valid_at, t.invalid_at, t.invalidated_by))
        out.sort(key=lambda f: (f.valid_at or datetime.min, f.id))
        return out

    @property
    def retriever(self) -> Retriever:
        """The read side (one per handle, shared by all threads)."""
        if self._retriever is None:
            with self._lazy:
                if self._retriever is None:
                    self._retriever = Retriever(self.store, self.vectors, lambda: self.embedder,
                                                self.config.extractor.spacy_model, self.retrieval,
                                                chat_client=self.chat_client)
        return self._retriever

    def retrieve(self, question: str, k: int = 5, mode: str = "graph",
                 config: RetrievalConfig | None = None, question_date: Any = None,
                 as_of: Any = None) -> list[Hit]:
        """Top-``k`` passages for ``question``; ``mode`` is graph | dense | bm25 | hybrid | decompose |
        expand (:meth:`decompose` and :meth:`expand` return the same hits with their traces).

        Each hit's ``why`` says how it was found (graph: seed facts and entities, the strongest
        seed-to-passage path, its PPR mass). ``config`` overrides this session's retrieval settings.
        Conversation memory: ``question_date`` (datetime or parseable string) resolves time
        expressions in the question ("last May"), whose units rank first; ``as_of`` shows memory
        as it stood then (later units are left out).
        """
        if not isinstance(question, str):
            raise ConfigError(f"question must be a string, got {type(question).__name__}")
        return self.retrieve_many([question], k=k, mode=mode, config=config,
                                  question_dates=None if question_date is None else [question_date],
                                  as_of=as_of)[0]

    def retrieve_many(self, questions: Sequence[str], k: int = 5, mode: str = "graph",
                      config: RetrievalConfig | None = None, question_dates: Sequence[Any] | None = None,
                      as_of: Any = None) -> list[list[Hit]]:
        """Top-``k`` passages per question: one embedding call and one batched PPR for all
        (``question_dates``: one per question, or None)."""
        return self.retriever.retrieve_many(questions, k, mode, config, question_dates, as_of)

    def decompose(self, question: str, k: int = 5, config: RetrievalConfig | None = None):
        """Decomposed constraint retrieval for one question: a
        :class:`~hipgraph.query.constraints.DecomposedRetrieval` with the steps, their attempts and
        bridges (``.trace()``) and the top-``k`` ``hits``, each naming the constraints it satisfies.
        """
        if not isinstance(question, str):
            raise ConfigError(f"question must be a string, got {type(question).__name__}")
        return self.retriever.decompose_many([question], k, config)[0]

    def expand(self, question: str, k: int = 5, config: RetrievalConfig | None = None,
               persist: bool = False):
        """Dynamic KG expansion for one question: an :class:`~hipgraph.query.expand.Expansion`
        with the verified subgraph (facts with provenance and support), the top-``k`` passages
        supporting it (``hits``) and the trace. ``persist=True`` writes verified new facts (those
        an LLM proposed) into the index, so the graph grows with use."""
        if not isinstance(question, str):
            raise ConfigError(f"question must be a string, got {type(question).__name__}")
        if persist and self.store.read_only:
            raise StoreError(f"{self.path}: opened read-only; persist=True needs a writable index")
        expansions = self.retriever.expand_many([question], k, config)  # reads only
        if persist:  # the retrieval has returned: now the write side stores what it learned
            self._persist_expansions(expansions, config or self.retrieval)
        return expansions[0]

    def _persist_expansions(self, expansions: list[Expansion], config: RetrievalConfig) -> None:
        """Write the expansions' verified new facts through the indexer (a fact proposed by
        several questions counts for the first); each expansion records how many of the facts it
        proposed first were written, and its facts get the ids they were stored under."""
        first: dict[tuple[str, str, str], tuple[int, LearnedFact]] = {}
        for q, e in enumerate(expansions):
            for f in e.new_facts:
                first.setdefault(f.key, (q, f))
        if not first:
            return
        model = config.llm.model if config.llm is not None else "none"
        done = self.indexer.persist_learned_facts([f for _, f in first.values()],
                                                  extractor=f"expand:{model}")
        for q, e in enumerate(expansions):
            e.persisted = sum(1 for key, (by, _) in first.items() if by == q and key in done.written)
            e.facts = [replace(f, fact_id=done.fact_ids[f.triple], subject_id=done.entity_ids[f.subject],
                               object_id=done.entity_ids[f.object])
                       if f.triple in done.fact_ids else f for f in e.facts]

    # ------------------------------------------------------------------ answering
    def answer(self, question: str, k: int | None = None, mode: str = "graph",
               generator: GeneratorConfig | Any | None = None,
               config: RetrievalConfig | None = None, question_date: Any = None,
               as_of: Any = None) -> Answer:
        """Retrieve ``k`` passages, build cited context and let ``generator`` answer.

        ``k=None``: 5 passages; over conversation memory with turn hits, as many of the best
        turns as the generator's ``context_tokens`` budget can hold (the context builder stops
        at the budget), each headed by its session's day.

        ``generator`` is a :class:`GeneratorConfig` (``none`` by default: the context only) or
        a ready backend with ``generate``/``count_tokens``. Retrieval never calls the generator.
        A reply that is not the JSON answer schema becomes a prose answer citing its ``[n]``
        markers (``usage["format"] == "prose"``) unless ``GeneratorConfig(strict_json=True)``.
        """
        if not isinstance(question, str):
            raise ConfigError(f"question must be a string, got {type(question).__name__}")
        return self.answer_many([question], k=k, mode=mode, generator=generator, config=config,
                                question_dates=None if question_date is None else [question_date],
                                as_of=as_of)[0]

    def answer_many(self, questions: Sequence[str], k: int | None = None, mode: str = "graph",
                    generator: GeneratorConfig | Any | None = None,
                    config: RetrievalConfig | None = None, question_dates: Sequence[Any] | None = None,
                    as_of: Any = None) -> list[Answer]:
        """:meth:`answer` for many questions: one retrieval batch, one generator batch."""
        from hipgraph.generation.answer import compose  # noqa: PLC0415

        gen_config = generator if isinstance(generator, GeneratorConfig) else GeneratorConfig()
        if k is None:
            k = self.retriever.context_depth(gen_config.context_tokens, config)
        hits = self.retrieve_many(questions, k=k, mode=mode, config=config,
                                  question_dates=question_dates, as_of=as_of)
        return compose(list(questions), hits, self._generator(generator), gen_config)

    def chat_client(self, config: ChatConfig) -> ChatClient:
        """The chat client of this handle for ``config`` (one per endpoint configuration)."""
        with self._lazy:
            if config not in self._chat_clients:
                self._chat_clients[config] = ChatClient(config)
            return self._chat_clients[config]

    def _generator(self, generator: GeneratorConfig | Any | None) -> Any:
        """The backend for ``generator`` (None for "none"); backends built from a config are
        kept for this handle's lifetime (a local model loads once) and closed with it."""
        if generator is None:
            return None
        if isinstance(generator, GeneratorConfig):
            if generator.name == "none":
                return None
            with self._lazy:
                if generator not in self._generators:
                    if generator.name == "local":
                        backend = registry.create("generator", "local", generator)
                    else:  # one HTTP client per endpoint, shared with graph retrieval's fact filter
                        backend = registry.create("generator", generator.name, generator.chat,
                                                  client=self.chat_client(generator.chat))
                    self._generators[generator] = backend
                return self._generators[generator]
        if not callable(getattr(generator, "generate", None)):
            raise ConfigError("generator must be a GeneratorConfig or an object with generate()")
        return generator

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        for backend in self._generators.values():
            backend.close()
        self._generators.clear()
        for client in self._chat_clients.values():
            client.close()
        self._chat_clients.clear()
        if self._retriever is not None:
            self._retriever.close()
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 - the next open brings them up to date
            logger.warning("FAISS files not saved on close (%s); the next open updates them from DuckDB", exc)
        if self.store is not None:
            self.store.close()
        # a closed index holds no vectors or graph in memory, even while the object lives on
        # (a large index's FAISS files and snapshot are gigabytes)
        if getattr(self, "vectors", None) is not None:
            self.vectors.indexes.clear()
        self._retriever = None
        self._indexer = None
        release_freed_memory()

    def __enter__(self) -> HipGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HipGraph({str(self.path)!r})"
