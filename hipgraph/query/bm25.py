"""Lexical BM25 passage index built on ``bm25s``.

This module owns the BM25 side of retrieval: tokenizing passage texts (lowercase, English
stopwords, optional Snowball stemming via PyStemmer), building a ``bm25s`` index over them,
keeping the caller's int64 passage ids alongside it, saving/loading that folder (memory-mapped,
written atomically) and answering top-``k`` queries with deterministic tie-breaking.

It does not know where texts come from: callers pass one string per passage (by convention
``title + "\\n" + text``) and the matching ids. The index folder holds the ``bm25s`` files,
``ids.npy`` and ``hipgraph_bm25.json`` (config, stemmer actually used, document count, the caller's
``source`` stamp and checksums of the arrays). Loading verifies the stamp, the checksums and the
score matrix's offsets and document range, and raises :class:`StoreError` on any mismatch.

Scores are ``bm25s``' own. Its ``"lucene"`` variant uses idf ``ln(1 + (N - df + 0.5) / (df + 0.5))``
and the term part ``tf / (tf + k1 * (1 - b + b * dl / avgdl))``, i.e. like Lucene >= 8 it leaves out
the constant ``(k1 + 1)`` factor of the textbook formula (same ranking, scores / (k1 + 1)).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import bm25s
import numpy as np

from hipgraph.errors import ConfigError, InputError, StoreError
from hipgraph.query.snapshot import array_checksum

# bm25s pins its logger to DEBUG when imported; let it follow the application's logging setup.
logging.getLogger("bm25s").setLevel(logging.NOTSET)
logger = logging.getLogger(__name__)

#: Scoring variants implemented by ``bm25s`` (its ``method`` argument).
BM25_METHODS: tuple[str, ...] = ("robertson", "lucene", "atire", "bm25l", "bm25+")
#: ``stopwords`` values meaning "keep every token".
NO_STOPWORDS: tuple[str, ...] = ("none", "")

META_NAME = "hipgraph_bm25.json"
_SCORE_ARRAYS = ("data", "indices", "indptr")  # bm25s' sparse token x document score matrix
IDS_NAME = "ids.npy"
FORMAT_NAME = "hipgraph-bm25"
FORMAT_VERSION = 2
STEMMER_LANGUAGE = "english"

try:  # PyStemmer is optional: without it tokens are not stemmed.
    import Stemmer as _pystemmer
except ImportError:  # pragma: no cover - depends on the environment
    _pystemmer = None
_warned_no_stemmer = False


@dataclass(frozen=True)
class BM25Config:
    """BM25 parameters and tokenizer settings.

    ``stopwords`` is a ``bm25s`` stopword list name (``"en"``, ``"english"``, ``"de"``, ...) or
    ``"none"`` for no stopword removal. ``stemming`` asks for the English Snowball stemmer; it is
    silently skipped (with a warning) when PyStemmer is not installed.
    """

    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"
    stemming: bool = True
    stopwords: str = "en"

    def __post_init__(self) -> None:
        if isinstance(self.k1, bool) or not isinstance(self.k1, (int, float)) or not self.k1 > 0:
            raise ConfigError(f"BM25Config.k1 must be a number > 0, got {self.k1!r}")
        if isinstance(self.b, bool) or not isinstance(self.b, (int, float)) or not 0 <= self.b <= 1:
            raise ConfigError(f"BM25Config.b must be a number in [0, 1], got {self.b!r}")
        if self.method not in BM25_METHODS:
            raise ConfigError(f"BM25Config.method must be one of {BM25_METHODS}, got {self.method!r}")
        if not isinstance(self.stemming, bool):
            raise ConfigError(f"BM25Config.stemming must be a bool, got {self.stemming!r}")
        if not isinstance(self.stopwords, str):
            raise ConfigError(f"BM25Config.stopwords must be a string, got {self.stopwords!r}")
        if self.stopwords.lower() not in NO_STOPWORDS:
            try:
                bm25s.tokenize(["probe"], stopwords=self.stopwords, return_ids=False,
                               show_progress=False)
            except ValueError as exc:
                raise ConfigError(
                    f"BM25Config.stopwords {self.stopwords!r} is not a bm25s stopword list"
                ) from exc


def stemmer_name(config: BM25Config) -> str | None:
    """Name of the stemmer that ``config`` gets in this environment (``None``: no stemming)."""
    if config.stemming and _pystemmer is not None:
        return STEMMER_LANGUAGE
    return None


def _stemmer(config: BM25Config) -> Any:
    if not config.stemming:
        return None
    if _pystemmer is None:
        global _warned_no_stemmer
        if not _warned_no_stemmer:
            logger.warning("PyStemmer is not installed; BM25 tokens will not be stemmed")
            _warned_no_stemmer = True
        return None
    return _pystemmer.Stemmer(STEMMER_LANGUAGE)


def _stopwords(config: BM25Config) -> str | None:
    return None if config.stopwords.lower() in NO_STOPWORDS else config.stopwords


def tokenize(texts: list[str], config: BM25Config = BM25Config()) -> list[list[str]]:
    """Tokens of each text exactly as the index sees them (lowercase, stopwords, stems)."""
    if not texts:
        return []
    out = bm25s.tokenize(list(texts), stopwords=_stopwords(config), stemmer=_stemmer(config),
                         return_ids=False, show_progress=False)
    # An empty text yields [] (bm25s' allow_empty=True); drop any "" token defensively.
    return [[t for t in doc if t] for doc in out]


class BM25Index:
    """A BM25 index over passages; ``search`` returns caller ids, not positions."""

    def __init__(self, ids: np.ndarray, retriever: bm25s.BM25 | None, config: BM25Config,
                 stemmer: str | None) -> None:
        self._ids = ids
        self._bm25 = retriever  # None: no documents or no token in any document
        self.config = config
        self.stemmer = stemmer

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, ids: np.ndarray, texts: list[str],
              config: BM25Config = BM25Config()) -> BM25Index:
        """Index ``texts[i]`` under ``ids[i]`` (int64, unique)."""
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise InputError(f"BM25 ids must be one-dimensional, got shape {ids.shape}")
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"BM25 ids must be integers, got dtype {ids.dtype}")
        ids = ids.astype(np.int64, copy=True)
        if len(ids) != len(texts):
            raise InputError(f"BM25 got {len(ids)} ids for {len(texts)} texts")
        if len(np.unique(ids)) != len(ids):
            raise InputError("BM25 passage ids must be unique")
        if any(not isinstance(t, str) for t in texts):
            raise InputError("BM25 texts must be strings")

        retriever = None
        if texts:
            tokenized = bm25s.tokenize(list(texts), stopwords=_stopwords(config),
                                       stemmer=_stemmer(config), return_ids=True,
                                       show_progress=False)
            if tokenized.vocab:
                retriever = bm25s.BM25(k1=float(config.k1), b=float(config.b),
                                       method=config.method)
                retriever.index(tokenized, create_empty_token=False, show_progress=False)
        logger.debug("built BM25 index over %d passages (%s)", len(ids),
                     "empty vocabulary" if retriever is None else
                     f"{len(retriever.vocab_dict)} terms")
        return cls(ids, retriever, config, stemmer_name(config))

    def __len__(self) -> int:
        return int(len(self._ids))

    @property
    def ids(self) -> np.ndarray:
        """The passage id of each indexed document, in index order."""
        return self._ids

    def _checksums(self) -> dict[str, int]:
        sums = {"ids": array_checksum(self._ids)}
        if self._bm25 is not None:
            sums.update({k: array_checksum(self._bm25.scores[k]) for k in _SCORE_ARRAYS})
        return sums

    # ------------------------------------------------------------------ save / load
    def save(self, folder: Path, source: Any = None) -> None:
        """Write the index to ``folder`` (replaced as a whole; readers never see a partial one).
        ``source`` (JSON) stamps what it was built from; :meth:`load` can require it."""
        folder = Path(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tag = f"{os.getpid()}.{uuid.uuid4().hex[:8]}"
        tmp = folder.with_name(f".{folder.name}.{tag}.tmp")
        old = folder.with_name(f".{folder.name}.{tag}.old")
        try:
            tmp.mkdir()
            if self._bm25 is not None:
                self._bm25.save(tmp, show_progress=False)
            np.save(tmp / IDS_NAME, np.ascontiguousarray(self._ids, dtype=np.int64),
                    allow_pickle=False)
            meta = {
                "format": FORMAT_NAME,
                "format_version": FORMAT_VERSION,
                "config": asdict(self.config),
                "stemmer": self.stemmer,
                "num_docs": len(self),
                "has_index": self._bm25 is not None,
                "bm25s_version": getattr(bm25s, "__version__", None),
                "source": source,
                "checksums": self._checksums(),
            }
            with open(tmp / META_NAME, "w", encoding="utf-8") as handle:
                json.dump(meta, handle, indent=2)
                handle.flush()
                os.fsync(handle.fileno())
            # A non-empty directory cannot be os.replace'd onto: move the old one aside first.
            if folder.exists():
                os.replace(folder, old)
            try:
                os.replace(tmp, folder)
            except BaseException:
                if old.exists() and not folder.exists():
                    os.replace(old, folder)
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)
        logger.debug("saved BM25 index (%d passages) to %s", len(self), folder)

    @classmethod
    def load(cls, folder: Path, config: BM25Config | None = None, source: Any = None) -> BM25Index:
        """Open a saved index (arrays memory-mapped) and verify it. ``config`` and ``source``
        (the stamp given to :meth:`save`), when given, must match."""
        folder = Path(folder)
        meta_path = folder / META_NAME
        if not meta_path.is_file():
            raise StoreError(f"no BM25 index at {folder} (missing {META_NAME})")
        try:
            with open(meta_path, encoding="utf-8") as handle:
                meta = json.load(handle)
            if meta.get("format") != FORMAT_NAME or meta.get("format_version") != FORMAT_VERSION:
                raise StoreError(f"{meta_path} is not a {FORMAT_NAME} v{FORMAT_VERSION} file")
            saved = BM25Config(**meta["config"])
            num_docs = int(meta["num_docs"])
            has_index = bool(meta["has_index"])
            stemmer = meta["stemmer"]
            checksums = dict(meta["checksums"])
        except StoreError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"corrupt BM25 metadata {meta_path}: {exc}") from exc
        if source is not None and meta.get("source") != source:
            raise StoreError(f"BM25 index at {folder} was built from {meta.get('source')}, "
                             f"not {source}")
        if config is not None and config != saved:
            raise StoreError(f"BM25 index at {folder} was built with {saved}, not {config}")
        if stemmer != stemmer_name(saved):
            raise StoreError(f"BM25 index at {folder} was built with stemmer {stemmer!r} but "
                             f"this environment gives {stemmer_name(saved)!r} (PyStemmer missing?)")
        try:
            ids = np.load(folder / IDS_NAME, mmap_mode="r", allow_pickle=False)
            retriever = None
            if has_index:
                retriever = bm25s.BM25.load(folder, mmap=True, load_corpus=False,
                                            show_progress=False)
        except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
            raise StoreError(f"corrupt BM25 index at {folder}: {exc}") from exc
        if ids.dtype != np.int64 or ids.ndim != 1 or len(ids) != num_docs:
            raise StoreError(f"corrupt BM25 index at {folder}: ids.npy has {ids.dtype} "
                             f"{ids.shape}, expected int64 ({num_docs},)")
        if retriever is not None:
            scores = retriever.scores
            if (scores.get("num_docs") != num_docs
                    or len(scores["indptr"]) != len(retriever.vocab_dict) + 1
                    or len(scores["data"]) != len(scores["indices"])
                    or retriever.method != saved.method
                    or not np.isclose(retriever.k1, saved.k1)
                    or not np.isclose(retriever.b, saved.b)):
                raise StoreError(f"corrupt BM25 index at {folder}: bm25s files disagree with "
                                 f"{META_NAME}")
        index = cls(ids, retriever, saved, stemmer)
        problem = index._problem(checksums)
        if problem:
            raise StoreError(f"corrupt BM25 index at {folder}: {problem}")
        return index

    def _problem(self, checksums: dict[str, int]) -> str | None:
        """Why the loaded arrays are not the saved ones or not a valid index (None if fine)."""
        if self._checksums() != checksums:
            return "its arrays differ from the ones saved (checksums)"
        if len(np.unique(self._ids)) != len(self._ids):
            return "ids.npy repeats ids"
        if self._bm25 is None:
            return None
        data, indices, indptr = (self._bm25.scores[k] for k in _SCORE_ARRAYS)
        if len(indptr) == 0 or indptr[0] != 0 or indptr[-1] != len(indices) \
                or bool(np.any(np.diff(indptr) < 0)):
            return "the score matrix offsets are not monotone from 0 to its size"
        if len(indices) and (int(np.min(indices)) < 0 or int(np.max(indices)) >= len(self._ids)):
            return f"the score matrix names documents outside [0, {len(self._ids)})"
        if not bool(np.all(np.isfinite(data))):
            return "the score matrix holds non-finite scores"
        return None

    # ------------------------------------------------------------------ search
    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` passages per query: ``(scores float32 (q, k), ids int64 (q, k))``.

        Only passages sharing at least one token with the query are returned; missing slots
        are ``-1`` with score ``0.0``. Ties are ordered by score descending, then id ascending.
        """
        if isinstance(queries, str):
            raise InputError("BM25Index.search takes a list of query strings, not one string")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"k must be a non-negative integer, got {k!r}")
        k = int(k)
        n_q = len(queries)
        out_scores = np.zeros((n_q, k), dtype=np.float32)
        out_ids = np.full((n_q, k), -1, dtype=np.int64)
        if n_q == 0 or k == 0 or self._bm25 is None:
            return out_scores, out_ids

        vocab = self._bm25.vocab_dict
        indices = self._bm25.scores["indices"]
        indptr = self._bm25.scores["indptr"]
        num_docs = len(self._ids)
        for row, tokens in enumerate(tokenize(list(queries), self.config)):
            token_ids = [vocab[t] for t in tokens if t in vocab]
            if not token_ids:
                continue
            scores = np.asarray(self._bm25.get_scores_from_ids(token_ids), dtype=np.float32)
            matched = np.zeros(num_docs, dtype=bool)
            for tid in set(token_ids):
                matched[indices[indptr[tid]:indptr[tid + 1]]] = True
            cand = np.flatnonzero(matched)
            if len(cand) > k:
                # Keep everything scoring at least the k-th best so boundary ties survive.
                kth = np.partition(scores[cand], len(cand) - k)[len(cand) - k]
                cand = cand[scores[cand] >= kth]
            cand_ids = self._ids[cand]
            order = np.lexsort((cand_ids, -scores[cand]))[:k]
            out_scores[row, :len(order)] = scores[cand[order]]
            out_ids[row, :len(order)] = cand_ids[order]
        return out_scores, out_ids

    def scores_all(self, queries: list[str]) -> np.ndarray:
        """Every indexed text's BM25 score for each query: float32 ``(queries, len(self))``, in
        the order the texts were indexed (0 where a text shares no token with the query)."""
        if isinstance(queries, str):
            raise InputError("BM25Index.scores_all takes a list of query strings, not one string")
        out = np.zeros((len(queries), len(self._ids)), dtype=np.float32)
        if self._bm25 is None:
            return out
        vocab = self._bm25.vocab_dict
        for row, tokens in enumerate(tokenize(list(queries), self.config)):
            token_ids = [vocab[t] for t in tokens if t in vocab]
            if token_ids:
                out[row] = np.asarray(self._bm25.get_scores_from_ids(token_ids), dtype=np.float32)
        return out
