"""hipgraph: a graph-based retrieval engine (entity/passage knowledge graphs, DuckDB + FAISS)."""

from __future__ import annotations

import logging

from hipgraph.api import HipGraph, open
from hipgraph.config import (
    ChatConfig,
    ChunkConfig,
    EmbedderConfig,
    ExtractorConfig,
    IndexConfig,
    SynonymConfig,
    VectorIndexConfig,
)
from hipgraph.errors import (
    HipgraphError,
    IndexLockedError,
    InputError,
    SchemaVersionError,
)
from hipgraph.types import Document, Hit, IndexReport

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "ChatConfig", "ChunkConfig", "Document", "EmbedderConfig", "ExtractorConfig", "HipGraph",
    "HipgraphError", "Hit", "IndexConfig", "IndexLockedError", "IndexReport", "InputError",
    "SchemaVersionError", "SynonymConfig", "VectorIndexConfig", "open",
]
