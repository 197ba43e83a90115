"""The command line's shared argument groups and the configs built from them (pyserini's
manner: each group is added to the commands that take it, and read back in one place)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from hipgraph.errors import InputError


# ---------------------------------------------------------------------- argument groups
def add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", required=True, type=Path, help="index folder (graph.duckdb + FAISS files)")


def add_output(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output")
    group.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
    group.add_argument("-q", "--quiet", action="store_true", help="no progress bars or log messages")
    group.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")


def add_llm(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("LLM endpoint (OpenAI-compatible)")
    group.add_argument("--llm-base-url", default=os.environ.get("HIPGRAPH_LLM_BASE_URL"),
                       help="e.g. http://127.0.0.1:8000/v1 (env HIPGRAPH_LLM_BASE_URL)")
    group.add_argument("--llm-model", default=os.environ.get("HIPGRAPH_LLM_MODEL"),
                       help="model name (env HIPGRAPH_LLM_MODEL)")
    group.add_argument("--llm-api-key-env", default="OPENAI_API_KEY",
                       help="environment variable holding the API key (unset: no key)")
    group.add_argument("--llm-concurrency", type=int, default=8, help="parallel requests")


def add_embedder(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "embedder endpoint (an index folder never supplies it: needed by every command on an index "
        "built with the openai embedder)")
    group.add_argument("--embedder", choices=("minilm", "openai"), default=None,
                       help="openai: any OpenAI-compatible /v1/embeddings endpoint (default: the "
                            "index's own, MiniLM for a new one)")
    group.add_argument("--embed-base-url", default=None, help="openai embedder endpoint")
    group.add_argument("--embed-model", default=None, help="openai embedder model")
    group.add_argument("--embed-api-key-env", default="OPENAI_API_KEY",
                       help="environment variable holding the embedder's API key (unset: no key)")


def session_embedder(args: argparse.Namespace):
    """The embedder config the flags give (``--embedder openai``), else None (the index's own)."""
    from hipgraph.config import EmbedderConfig  # noqa: PLC0415

    if args.embedder != "openai" and not args.embed_base_url:
        return None
    if not args.embed_base_url or not args.embed_model:
        raise InputError("--embedder openai needs --embed-base-url and --embed-model")
    return EmbedderConfig(name="openai", base_url=args.embed_base_url, model=args.embed_model,
                          api_key_env=args.embed_api_key_env)


def add_retrieval(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("retrieval")
    group.add_argument("--fact-filter", action="store_true",
                       help="graph mode: let the LLM (--llm-base-url/--llm-model) keep the relevant facts")
    group.add_argument("--llm-steps", action="store_true",
                       help="decompose/expand modes: let the LLM decompose the question, read each "
                            "step's passages for its bridge, rewrite weak steps and propose facts")
    group.add_argument("--memory-hits", choices=("turn", "unit"), default="turn",
                       help="conversation memory: each hit one turn, the best turns of the best "
                            "units first (turn, the default; -k counts turns), or one memory unit "
                            "with all its turns (unit)")
    add_llm(parser)


def retrieval_config(args: argparse.Namespace):
    from hipgraph.config import ChatConfig, RetrievalConfig  # noqa: PLC0415

    memory_hits = getattr(args, "memory_hits", "turn")
    if not args.fact_filter and not args.llm_steps:
        return None if memory_hits == "turn" else RetrievalConfig(memory_hits=memory_hits)
    flag = "--fact-filter" if args.fact_filter else "--llm-steps"
    if not args.llm_base_url or not args.llm_model:
        raise InputError(f"{flag} needs --llm-base-url and --llm-model")
    config = RetrievalConfig(llm=ChatConfig(base_url=args.llm_base_url, model=args.llm_model,
                                            api_key_env=args.llm_api_key_env,
                                            max_concurrency=args.llm_concurrency),
                             memory_hits=memory_hits)
    if not args.fact_filter:
        config = config.replace(graph=dataclasses.replace(config.graph, fact_filter=False))
    return config


def extractor_config(args: argparse.Namespace):
    from hipgraph.config import ChatConfig, ExtractorConfig  # noqa: PLC0415

    if args.extractor is None:
        return None
    name, _, arg = args.extractor.partition(":")
    if name == "spacy":
        return ExtractorConfig(name="spacy")
    if name == "precomputed":
        if not arg:
            raise InputError("--extractor precomputed needs a file: precomputed:FILE")
        return ExtractorConfig(name="precomputed", precomputed_path=str(Path(arg).resolve()))
    if name == "llm":
        if not args.llm_base_url or not args.llm_model:
            raise InputError("--extractor llm needs --llm-base-url and --llm-model")
        chat = ChatConfig(base_url=args.llm_base_url, model=args.llm_model,
                          api_key_env=args.llm_api_key_env, max_concurrency=args.llm_concurrency)
        return ExtractorConfig(name="llm", chat=chat)
    raise InputError(f"unknown extractor {args.extractor!r} (spacy | llm | precomputed:FILE)")


def new_index_config(args: argparse.Namespace):
    from hipgraph.config import ChunkConfig, IndexConfig, VectorIndexConfig  # noqa: PLC0415

    config = IndexConfig()
    changes: dict[str, Any] = {}
    if args.chunk_tokens or args.chunk_overlap is not None:
        changes["chunk"] = ChunkConfig(max_tokens=args.chunk_tokens or config.chunk.max_tokens,
                                       overlap=config.chunk.overlap if args.chunk_overlap is None else args.chunk_overlap)
    if args.vector_index:
        changes["vectors"] = VectorIndexConfig(kind=args.vector_index)
    embedder = session_embedder(args)
    if embedder is not None:
        changes["embedder"] = embedder
    if args.batch_size:
        changes["batch_size"] = args.batch_size
    return config.replace(**changes) if changes else config


def add_generator(group: argparse._ArgumentGroup, default: str = "none", help: str | None = None) -> None:  # noqa: A002
    """``--generator none|openai|local``, ``--context-tokens`` and ``--strict-json``."""
    group.add_argument("--generator", choices=("none", "openai", "local"), default=default,
                       help=help or "none (the cited context, the default), openai (--llm-base-url/"
                                    "--llm-model) or local (a transformers model)")
    group.add_argument("--context-tokens", type=int, default=2000, help="context budget in tokens")
    add_strict_json(group)


def add_strict_json(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--strict-json", action="store_true",
                       help="a reply that is not the JSON answer schema is an error (default: it "
                            "is used as a prose answer, its [n] markers as citations)")


def generator_config(args: argparse.Namespace):
    from hipgraph.config import ChatConfig, GeneratorConfig  # noqa: PLC0415

    if args.generator == "none":
        return GeneratorConfig(name="none", context_tokens=args.context_tokens)
    if args.generator == "local":
        return GeneratorConfig(name="local", model_path=args.llm_model, context_tokens=args.context_tokens,
                               strict_json=args.strict_json)
    if not args.llm_base_url or not args.llm_model:
        raise InputError("--answer --generator openai needs --llm-base-url and --llm-model "
                         "(or HIPGRAPH_LLM_BASE_URL / HIPGRAPH_LLM_MODEL)")
    chat = ChatConfig(base_url=args.llm_base_url, model=args.llm_model,
                      api_key_env=args.llm_api_key_env, max_concurrency=args.llm_concurrency)
    return GeneratorConfig(name="openai", chat=chat, context_tokens=args.context_tokens,
                           strict_json=args.strict_json)


def add_dates(p: argparse.ArgumentParser) -> None:
    """How conversations' numeric dates are read (default: decided per conversation)."""
    group = p.add_argument_group("conversation dates")
    order = group.add_mutually_exclusive_group()
    order.add_argument("--dayfirst", dest="dayfirst", action="store_true", default=None,
                       help="numeric dates are day-first (01.02.2024 is 1 February)")
    order.add_argument("--monthfirst", dest="dayfirst", action="store_false",
                       help="numeric dates are month-first (01/02/2024 is 2 January)")
    order.add_argument("--date-format", default=None,
                       help="every time is in this strptime format, e.g. '%%d.%%m.%%Y, %%H:%%M:%%S'")


def date_order(args: argparse.Namespace):
    from hipgraph.indexers.conversations import DateOrder  # noqa: PLC0415

    return DateOrder(dayfirst=args.dayfirst, date_format=args.date_format)
