"""What reopening an index needs from the session: the same embedder (checked against the
saved one), and the messages that say what to pass where an index folder never supplies it."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path
from typing import Any

from hipgraph.config import EMBEDDER_CONNECTION_FIELDS, EMBEDDERS_NEEDING_SESSION, EmbedderConfig
from hipgraph.errors import ConfigError


def check_same_embedder(path: Path, built: str, saved: dict[str, Any], session: EmbedderConfig,
                         dimension: int) -> EmbedderConfig:
    """``session`` (which says where to connect) if it makes the vectors the index holds: the
    saved backend and model settings, and for a remote embedder vectors of the index's
    ``dimension`` (given to it when unset, so replies of another width are refused)."""
    remote = session.name in EMBEDDERS_NEEDING_SESSION
    if remote and session.dimension is None:
        session = replace(session, dimension=dimension)
    ignored = (*EMBEDDER_CONNECTION_FIELDS, "dimension") if remote else EMBEDDER_CONNECTION_FIELDS
    given = {k: v for k, v in dataclasses.asdict(session).items() if k not in ignored}
    recorded = {**dataclasses.asdict(EmbedderConfig()), **saved}  # defaults for absent keys
    recorded = {k: v for k, v in recorded.items() if k not in ignored}
    differ = sorted(k for k in given if given[k] != recorded.get(k))
    widths = {session.dimension, dimension} | ({saved["dimension"]} if saved.get("dimension") else set())
    if remote and len(widths) > 1:
        differ.append("dimension")
    if differ:
        raise ConfigError(
            f"index {path} was built with embedder {built!r} ({saved}, {dimension}-d vectors); "
            "a different embedder config cannot be used with it "
            f"(differs in {', '.join(sorted(differ))})")
    return session


def remote_embedder_message(path: Path, built: str, saved: dict[str, Any]) -> str:
    model = saved.get("model") or "MODEL"
    return (f"index {path} was built with the remote embedder {built!r}; an index folder never "
            "says where to send text or which API key to send: pass hipgraph.open(path, "
            f"embedder=EmbedderConfig(name='openai', model={model!r}, base_url=URL, "
            "api_key_env=VAR)) (CLI: --embedder openai --embed-base-url URL "
            f"--embed-model {model} [--embed-api-key-env VAR]) to reopen it")


def extractor_message(path: Path, name: str) -> str:
    how = ("extractor=ExtractorConfig(name='llm', chat=ChatConfig(base_url=URL, model=MODEL)) "
           "(CLI: --extractor llm --llm-base-url URL --llm-model MODEL)" if name == "llm" else
           "extractor=ExtractorConfig(name='precomputed', precomputed_path=FILE) "
           "(CLI: --extractor precomputed:FILE)")
    return (f"index {path} was built with the {name} extractor, whose endpoint or file an index "
            f"folder never supplies: pass {how}, or another extractor, to add documents")
