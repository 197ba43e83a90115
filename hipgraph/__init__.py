"""hipgraph: a graph-based retrieval engine (entity/passage knowledge graphs, DuckDB + FAISS)."""

from __future__ import annotations

import logging

from hipgraph.api import HipGraph, open
from hipgraph.config import (
    ChatConfig,
    ChunkConfig,
    EmbedderConfig,
    ExtractorConfig,
    GeneratorConfig,
    GraphRetrievalConfig,
    IndexConfig,
    RetrievalConfig,
    SynonymConfig,
    VectorIndexConfig,
)
from hipgraph.errors import (
    ConfigError,
    HipgraphError,
    IndexLockedError,
    IndexNotFoundError,
    InputError,
    SchemaVersionError,
)
from hipgraph.types import Answer, Document, Hit, IndexReport

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "Answer", "ChatConfig", "ChunkConfig", "ConfigError", "Document", "EmbedderConfig", "ExtractorConfig",
    "GeneratorConfig", "GraphRetrievalConfig", "HipGraph", "HipgraphError", "Hit", "IndexConfig", "IndexLockedError",
    "IndexNotFoundError", "IndexReport", "InputError", "RetrievalConfig", "SchemaVersionError",
    "SynonymConfig", "VectorIndexConfig", "open",
]
