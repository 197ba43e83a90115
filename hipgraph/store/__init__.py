"""Storage: one DuckDB database per index (source of truth) plus FAISS files beside it."""

from hipgraph.store.database import GraphStore
from hipgraph.store.schema import SCHEMA_VERSION

__all__ = ["GraphStore", "SCHEMA_VERSION"]
