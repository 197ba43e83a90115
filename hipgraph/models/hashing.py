"""A model-free embedder: each word gets a fixed random direction, a text the normalized sum.

Texts sharing words get similar vectors, and nothing else: no meaning, no synonyms. It exists for
what needs vectors at a scale or speed no model gives on CPU (``benchmarks/scale.py`` at a million
passages, labelled as synthetic vectors there) and as a fast stand-in where a test is about the
pipeline, not retrieval quality. Deterministic across processes and machines.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np
from scipy import sparse

from hipgraph.config import EmbedderConfig

_WORD = re.compile(r"\w+")


class HashingEmbedder:
    """Sum of per-word Gaussian directions (seeded by a hash of the word), L2-normalized."""

    def __init__(self, config: EmbedderConfig | None = None, cache_words: int = 50_000):
        self.config = config or EmbedderConfig(name="hashing")
        self.dimension = int(self.config.dimension or 384)
        self.name = f"hashing:{self.dimension}"
        self._cache: dict[str, np.ndarray] = {}
        self._cache_words = cache_words

    def _word(self, word: str) -> np.ndarray:
        vec = self._cache.get(word)
        if vec is None:
            seed = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
            vec = np.random.default_rng(seed).standard_normal(self.dimension).astype(np.float32)
            if len(self._cache) >= self._cache_words:
                self._cache.clear()  # bounded memory: frequent words come back quickly
            self._cache[word] = vec
        return vec

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        # one sparse product over the batch's distinct words: row i adds its words' directions in
        # the order they occur, the same sums as adding them one by one
        vocab: dict[str, int] = {}
        columns: list[int] = []
        indptr = [0]
        for i, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            if not words:
                out[i, 0] = 1.0
            columns.extend(vocab.setdefault(w, len(vocab)) for w in words)
            indptr.append(len(columns))
        if vocab:
            directions = np.stack([self._word(w) for w in vocab])
            counts = sparse.csr_matrix(
                (np.ones(len(columns), np.float32), np.array(columns, np.int64), np.array(indptr, np.int64)),
                shape=(len(texts), len(vocab)))
            out += counts @ directions
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out
