"""hipgraph: a graph-based retrieval engine (entity/passage knowledge graphs, DuckDB + FAISS)."""

from __future__ import annotations

import logging

from hipgraph.api import RETRIEVAL_MODES, HipGraph, open
from hipgraph.config import (
    ChatConfig,
    ChunkConfig,
    ConversationConfig,
    DecomposeConfig,
    EmbedderConfig,
    ExpandConfig,
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
    SessionConfigError,
)
from hipgraph.types import Answer, Conversation, Document, Fact, Hit, IndexReport, Session, Turn

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "RETRIEVAL_MODES", "Answer", "ChatConfig", "ChunkConfig", "ConfigError", "Conversation", "ConversationConfig",
    "DecomposeConfig", "Document", "EmbedderConfig", "ExpandConfig", "ExtractorConfig", "Fact", "GeneratorConfig",
    "GraphRetrievalConfig", "HipGraph", "HipgraphError", "Hit", "IndexConfig", "IndexLockedError",
    "IndexNotFoundError", "IndexReport", "InputError", "RetrievalConfig", "SchemaVersionError", "Session", "SessionConfigError",
    "SynonymConfig", "Turn", "VectorIndexConfig", "open",
]
