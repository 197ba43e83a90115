"""BM25 over a list of texts that only grows, scored at query time.

``bm25s`` (:mod:`hipgraph.query.bm25`) stores every (term, text) score, and each of them depends
on the number of texts, the term's document frequency and the mean text length; appending one text
changes them all, so the index is rebuilt whole (3 s for 100,000 memory turns). :class:`LiveBM25`
keeps term frequencies instead, in immutable segments, and computes the scores of a query's terms
when asked; :meth:`LiveBM25.extended` adds texts in a new segment (segments of similar size are
merged, so a text is copied O(log n) times over the life of the index) without touching the
index it was called on, which readers may still be using.

Scores equal ``bm25s``' Lucene variant (the default :class:`BM25Config`) bit for bit, in the same
arithmetic: idf ``ln(1 + (N - df + 0.5) / (df + 0.5))`` rounded to float32, the term part
``tf / (k1 (1 - b + b dl / avgdl) + tf)`` in float64, their product rounded to float32, and a text's
score summed in float32 over the query's terms in query order (repeated terms count again).
``tests/test_bm25_live.py`` checks this against ``BM25Index``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from hipgraph.errors import ConfigError, InputError
from hipgraph.query.bm25 import BM25Config, tokenize


@dataclass(frozen=True)
class _Segment:
    """Term frequencies of texts ``start .. start + lengths.size - 1``."""

    start: int
    lengths: np.ndarray  # (n,) int64 tokens per text
    postings: dict[str, tuple[np.ndarray, np.ndarray]]  # term -> (text numbers int64, tf float64)

    @property
    def size(self) -> int:
        return int(self.lengths.size)


def _segment(start: int, token_lists: list[list[str]]) -> _Segment:
    docs: dict[str, list[int]] = {}
    tfs: dict[str, list[int]] = {}
    for i, tokens in enumerate(token_lists):
        for term, tf in Counter(tokens).items():
            docs.setdefault(term, []).append(start + i)
            tfs.setdefault(term, []).append(tf)
    postings = {t: (np.asarray(docs[t], np.int64), np.asarray(tfs[t], np.float64)) for t in docs}
    return _Segment(start, np.asarray([len(t) for t in token_lists], np.int64), postings)


def _merge(a: _Segment, b: _Segment) -> _Segment:
    postings = dict(a.postings)
    for term, (docs, tfs) in b.postings.items():
        if term in postings:
            d, f = postings[term]
            postings[term] = (np.concatenate([d, docs]), np.concatenate([f, tfs]))
        else:
            postings[term] = (docs, tfs)
    return _Segment(a.start, np.concatenate([a.lengths, b.lengths]), postings)


_DEFAULT = BM25Config()


class LiveBM25:
    """A BM25 index whose texts are numbered ``0 .. len - 1`` in the order given (module docstring)."""

    def __init__(self, config: BM25Config = _DEFAULT, segments: tuple[_Segment, ...] = (),
                 total_length: int = 0):
        if config.method != "lucene":
            raise ConfigError(f"LiveBM25 scores the lucene variant only, not {config.method!r}")
        self.config = config
        self._segments = segments
        self._total = total_length
        self._n = sum(s.size for s in segments)

    @classmethod
    def build(cls, texts: list[str], config: BM25Config = _DEFAULT) -> LiveBM25:
        return cls(config).extended(texts)

    def __len__(self) -> int:
        return self._n

    def extended(self, texts: list[str]) -> LiveBM25:
        """A new index holding these texts and then ``texts`` (this one is left as it is)."""
        if any(not isinstance(t, str) for t in texts):
            raise InputError("BM25 texts must be strings")
        if not texts:
            return self
        seg = _segment(self._n, tokenize(list(texts), self.config))
        added = int(seg.lengths.sum())
        segments = list(self._segments)
        while segments and segments[-1].size <= 2 * seg.size:  # merge similar sizes (a binary counter)
            seg = _merge(segments.pop(), seg)
        segments.append(seg)
        return LiveBM25(self.config, tuple(segments), self._total + added)

    def scores_all(self, queries: list[str]) -> np.ndarray:
        """Every text's score for each query: float32 ``(queries, len(self))`` (0 where a text
        shares no term with the query), as ``BM25Index.scores_all`` gives them."""
        if isinstance(queries, str):
            raise InputError("LiveBM25.scores_all takes a list of query strings, not one string")
        out = np.zeros((len(queries), self._n), dtype=np.float32)
        if not self._n:
            return out
        k1, b = float(self.config.k1), float(self.config.b)
        avgdl = np.float64(self._total) / self._n  # as numpy's mean of the lengths
        lengths = np.concatenate([s.lengths for s in self._segments])
        norm = k1 * ((1 - b) + b * lengths.astype(np.float64) / avgdl)
        for row, tokens in enumerate(tokenize(list(queries), self.config)):
            for term in tokens:
                parts = [s.postings[term] for s in self._segments if term in s.postings]
                if not parts:
                    continue  # not in the vocabulary: ignored, as bm25s does
                docs = np.concatenate([d for d, _ in parts])
                tf = np.concatenate([f for _, f in parts])
                df = docs.size
                idf = np.float32(math.log(1 + (self._n - df + 0.5) / (df + 0.5)))
                scores = (np.float64(idf) * (tf / (norm[docs] + tf))).astype(np.float32)
                out[row, docs] += scores  # a text appears once per term
        return out
