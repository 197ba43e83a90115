"""Embeddings from any OpenAI-compatible ``/embeddings`` endpoint (OpenAI, vLLM, Ollama, TEI)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

from hipgraph.config import EmbedderConfig
from hipgraph.errors import ConfigError, EmbeddingError
from hipgraph.models.chat import auth_headers, excerpt, post_json

logger = logging.getLogger(__name__)

BATCH_SIZE = 256  # inputs per request


class OpenAIEmbedder:
    """:class:`~hipgraph.models.base.Embedder` over ``{base_url}/embeddings``.

    Rows are L2-normalized float32. ``dimension`` comes from ``config.dimension`` or is probed
    by embedding one string on first use (note: ``isinstance(x, Embedder)`` reads it too).
    """

    def __init__(self, config: EmbedderConfig, *, backoff: float = 0.5) -> None:
        if not config.base_url or not config.model:
            raise ConfigError("the openai embedder needs embedder.base_url and embedder.model")
        if backoff < 0:
            raise ConfigError(f"backoff must be >= 0, got {backoff}")
        self.config = config
        self.name = f"openai:{config.model}"
        self.url = config.base_url.rstrip("/") + "/embeddings"
        self._backoff = backoff
        self._dimension: int | None = config.dimension
        self._lock = threading.Lock()
        self._http = httpx.Client(timeout=httpx.Timeout(config.timeout))

    @property
    def dimension(self) -> int:
        if self._dimension is None:
            with self._lock:
                if self._dimension is None:
                    logger.debug("probing the embedding dimension of %s", self.name)
                    self._dimension = int(self._embed_batch(["dimension probe"]).shape[1])
        return self._dimension

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return a ``(len(texts), dimension)`` float32 array with unit-norm rows."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of strings, not a single string")
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        parts = [self._embed_batch(texts[i:i + BATCH_SIZE]) for i in range(0, len(texts), BATCH_SIZE)]
        out = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out /= np.maximum(norms, 1e-12)
        return out

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        # The OpenAI API rejects empty strings; embed a single space instead.
        inputs = [t if t else " " for t in texts]
        data = post_json(
            self._http, self.url, {"model": self.config.model, "input": inputs},
            headers=auth_headers(self.config.api_key_env),
            max_retries=self.config.max_retries,
            backoff=self._backoff,
            error=EmbeddingError,
        )
        matrix = self._parse(data, len(inputs))
        if self._dimension is None:
            self._dimension = matrix.shape[1]
        elif matrix.shape[1] != self._dimension:
            raise EmbeddingError(
                f"{self.url}: model {self.config.model!r} returned {matrix.shape[1]}-d vectors, "
                f"expected {self._dimension}"
            )
        return matrix

    def _parse(self, data: Any, n: int) -> np.ndarray:
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list) or len(items) != n:
            got = len(items) if isinstance(items, list) else "no"
            raise EmbeddingError(f"{self.url}: expected {n} embeddings, got {got}: "
                                 f"{excerpt(repr(data))}")
        try:
            ordered = sorted(items, key=lambda item: int(item["index"])) if all(
                isinstance(item, dict) and "index" in item for item in items) else items
            matrix = np.asarray([item["embedding"] for item in ordered], dtype=np.float32)
        except (KeyError, TypeError, ValueError) as exc:
            raise EmbeddingError(f"{self.url}: malformed embeddings reply: "
                                 f"{excerpt(repr(data))}") from exc
        if matrix.ndim != 2 or matrix.shape[0] != n or matrix.shape[1] == 0:
            raise EmbeddingError(f"{self.url}: embeddings have inconsistent shape {matrix.shape}")
        if not np.isfinite(matrix).all():
            raise EmbeddingError(f"{self.url}: embeddings contain NaN or infinity")
        return matrix

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OpenAIEmbedder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
