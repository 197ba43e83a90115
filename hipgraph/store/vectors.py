"""FAISS vector indexes whose ids are the DuckDB ids, saved atomically beside the database.

DuckDB's ``*_vectors`` tables are the source of truth: a FAISS file that is missing, unreadable,
holds another id set than DuckDB (stale after a crash between commit and save) or fails the spot
check of :meth:`FaissVectorIndex.spot_check` (damaged codes) is rebuilt from them.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import numpy as np

from hipgraph.config import VectorIndexConfig
from hipgraph.errors import BackendUnavailableError, StoreError
from hipgraph.store.scan import pairs_at_least

logger = logging.getLogger(__name__)

SCORE_TOLERANCE = {True: 0.05, False: 1e-3}  # a unit vector's best score: 1 +- this (quantised?)
# range searches for "every vector with cosine >= t" ask for t minus this (candidate_margin):
# on 22,201 MiniLM entity vectors, IVF-SQ8 missed 8 of 16,988 pairs >= 0.8 at 1e-4, none at 5e-3
FLOAT_CANDIDATE_MARGIN = 1e-4
SQ8_CANDIDATE_MARGIN = 1e-2
RANGE_BATCH = 4096  # query rows per FAISS range search (synonym kNN of a batch's new entities)
FLAT_RANGE_BLOCK = 1 << 21  # scores (floats) per block of a flat range search: 8 MB
FLAT_RANGE_ROWS = 1024  # queries that share each slice of a flat range search's stored vectors
# an IVF range search runs as one matrix product per probed list (BLAS) once a call probes each
# list for at least this many queries on average; below it FAISS's own scan, one query at a time,
# is faster (it needs no decoding of whole lists). Measured even at 5-8 queries per list on two
# machines (``benchmarks/synonym_search.py --batches``), ahead from there on
IVF_BLAS_QUERIES_PER_LIST = 8


def _per_query(rows: np.ndarray, ids: np.ndarray, scores: np.ndarray, m: int
               ) -> list[tuple[np.ndarray, np.ndarray]]:
    """A range search's hits, ordered by query row (``rows`` ascending), as ``(ids, scores)``
    for each of the ``m`` queries (empty arrays for a query without hits)."""
    bounds = np.searchsorted(rows, np.arange(m + 1))
    return [(ids[a:b], scores[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _faiss():
    try:
        import faiss  # noqa: PLC0415 - optional dependency, imported on first use
    except ImportError as exc:
        raise BackendUnavailableError(
            "FAISS is not installed: pip install 'hipgraph[cpu]' (faiss-cpu) "
            "or 'hipgraph[gpu]' (faiss-gpu-cu12), never both"
        ) from exc
    return faiss


def gpu_count() -> int:
    """Number of GPUs FAISS sees (0 on faiss-cpu builds)."""
    faiss = _faiss()
    get = getattr(faiss, "get_num_gpus", None)
    return int(get()) if get is not None else 0


class FaissVectorIndex:
    """Inner-product search over unit vectors (= cosine) keyed by int64 ids.

    The layout follows :meth:`VectorIndexConfig.layout` for the number of vectors: ``flat`` is
    exact; ``ivf`` (scalar-quantized lists by default) and ``hnsw`` trade exactness for speed and
    memory on large indexes. The CPU index is the one saved; a GPU copy serves searches when FAISS
    sees a GPU.
    """

    def __init__(self, dimension: int, config: VectorIndexConfig | None = None):
        self.dimension = int(dimension)
        self.config = config or VectorIndexConfig()
        self._faiss = _faiss()
        self.trained_on = 0  # vectors the IVF layout was trained for
        self._index = self._new_index(0)
        self._gpu_index = None
        self._gpu_lock = threading.Lock()  # GPU copy: made once, searched by one thread at a time

    # ------------------------------------------------------------------ construction
    def _new_index(self, expected: int):
        faiss = self._faiss
        d = self.dimension
        layout = self.config.layout(expected)
        if layout == "hnsw":
            inner = faiss.IndexHNSWFlat(d, self.config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            inner.hnsw.efSearch = self.config.hnsw_ef_search
        elif layout == "ivf":
            nlist = self.config.nlist(expected)
            quantizer = faiss.IndexFlatIP(d)
            if self.config.ivf_encoding == "sq8":
                inner = faiss.IndexIVFScalarQuantizer(quantizer, d, nlist, faiss.ScalarQuantizer.QT_8bit,
                                                      faiss.METRIC_INNER_PRODUCT)
            else:
                inner = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
            inner.nprobe = self.config.nprobe(nlist)
            self._quantizer = quantizer  # keep the Python object alive with the index
            self.trained_on = expected
        else:
            inner = faiss.IndexFlatIP(d)
        index = faiss.IndexIDMap2(inner)
        self._inner = inner
        return index

    @property
    def layout(self) -> str:
        """The layout held now: flat | ivf | hnsw."""
        if isinstance(self._inner, self._faiss.IndexHNSW):
            return "hnsw"
        return "ivf" if hasattr(self._inner, "nprobe") else "flat"

    @property
    def candidate_margin(self) -> float:
        """How far below its exact cosine a stored vector's score may come out: float32 scores
        (flat, HNSW, IVF with float lists) are within ~1e-7, scalar-quantized (SQ8) codes move it
        by up to a few thousandths, so a range search meant to find every vector at or above a
        threshold asks for this much less (the caller decides each candidate exactly)."""
        if isinstance(self._inner, self._faiss.IndexIVFScalarQuantizer):  # as built, not as configured
            return SQ8_CANDIDATE_MARGIN
        return FLOAT_CANDIDATE_MARGIN

    @property
    def supports_remove(self) -> bool:
        return self.layout == "flat"

    def needs_relayout(self, n: int) -> bool:
        """True when an index of ``n`` vectors should be rebuilt: it crossed the size at which the
        configured layout changes, or an IVF index outgrew its lists (``retrain_growth``)."""
        current, wanted = self.layout, self.config.layout(n)
        if current != wanted:
            return current != "hnsw"
        return current == "ivf" and n > self.config.retrain_growth * max(self.trained_on, 1)

    def build(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Replace the contents with ``vectors`` under ``ids``."""
        self.build_streamed(len(ids), vectors, [(ids, vectors)])

    def build_streamed(self, n: int, sample: np.ndarray, batches) -> None:
        """Replace the contents with ``n`` vectors given as ``(ids, vectors)`` batches; the layout
        for ``n`` is trained on ``sample`` (rows drawn from the same vectors) when it needs it."""
        self._index = self._new_index(n)
        if not self._index.is_trained and n:
            self._index.train(np.ascontiguousarray(sample, dtype=np.float32))
        for ids, vectors in batches:
            self.add(ids, vectors)

    def training_size(self, n: int) -> int:
        """How many sample vectors :meth:`build_streamed` wants for ``n`` vectors (0: none)."""
        return 0 if self.config.layout(n) != "ivf" else min(n, 64 * self.config.nlist(n))

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids) == 0:
            return
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.shape != (len(ids), self.dimension):
            raise StoreError(f"vector shape {vectors.shape} does not match {len(ids)} x {self.dimension}")
        self._index.add_with_ids(vectors, np.ascontiguousarray(ids, dtype=np.int64))
        self._gpu_index = None

    def remove(self, ids: np.ndarray) -> None:
        """Remove ``ids``; callers rebuild instead when :attr:`supports_remove` is false."""
        if len(ids) == 0:
            return
        if not self.supports_remove:
            raise StoreError(f"{self.layout} index does not support removal; rebuild it")
        self._index.remove_ids(np.ascontiguousarray(ids, dtype=np.int64))
        self._gpu_index = None

    # ------------------------------------------------------------------ reading
    @property
    def ntotal(self) -> int:
        return int(self._index.ntotal)

    def ids(self) -> np.ndarray:
        """The ids held, sorted."""
        return np.sort(self._faiss.vector_to_array(self._index.id_map).astype(np.int64))

    def spot_check(self, ids: np.ndarray, vectors: np.ndarray) -> str | None:
        """Why this index does not hold ``vectors`` (DuckDB's rows) under ``ids``, or None.

        Each vector is read back from the stored codes and must equal DuckDB's (for 8-bit codes:
        DuckDB's vector encoded and decoded by this index); the unit ones are searched: the best
        score must be finite and about 1 (at most about 1 on HNSW, whose search is approximate),
        which a damaged vector elsewhere in the file (huge or NaN scores) breaks."""
        if len(ids) == 0:
            return None
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        quantised = isinstance(self._inner, self._faiss.IndexIVFScalarQuantizer)
        try:
            stored = self._stored_vectors(np.asarray(ids, np.int64), vectors)
            unit = np.abs(np.einsum("ij,ij->i", vectors, vectors) - 1.0) < 1e-3
            top = self._index.search(vectors[unit], 1)[0][:, 0] if unit.any() else np.ones(0)
        except RuntimeError as exc:
            return f"FAISS cannot read its vectors back ({exc})"
        expected = self._inner.sa_decode(self._inner.sa_encode(vectors)) if quantised else vectors
        with np.errstate(invalid="ignore", over="ignore"):  # damaged codes may decode to inf/NaN
            error = np.max(np.abs(stored - expected), axis=1)
        bad = ~(error <= 1e-5)
        if bad.any():
            return f"vector {int(ids[np.argmax(bad)])} differs from DuckDB's (by {error[bad][0]:.3g})"
        tol = SCORE_TOLERANCE[quantised]
        ok = np.isfinite(top) & (top <= 1 + tol) & ((top >= 1 - tol) | (self.layout == "hnsw"))
        if not ok.all():
            return f"a stored vector's best match scores {top[~ok][0]:.3g}, not about 1"
        return None

    def _stored_vectors(self, ids: np.ndarray, vectors: np.ndarray) -> np.ndarray:
        """The vectors stored under ``ids`` (NaN rows where not found). Flat and HNSW storage are
        read by id; IVF lists (no direct map) by searching DuckDB's copy, whose own list is probed
        first, and keeping the hit with the id. When it is missing because every hit ties (more
        identical copies than hits), the best hit (an identical copy) stands in."""
        if self.layout != "ivf":
            return np.stack([self._index.reconstruct(int(i)) for i in ids])
        scores, labels, found = self._inner.search_and_reconstruct(vectors, min(self.ntotal, 16))
        id_map = self._faiss.vector_to_array(self._index.id_map).astype(np.int64)
        out = np.full_like(vectors, np.nan)
        for row, want in enumerate(ids):
            hit = labels[row] >= 0
            exact = np.flatnonzero(id_map[labels[row][hit]] == want)
            if exact.size:
                out[row] = found[row][hit][exact[0]]
            elif hit.all() and scores[row, -1] >= scores[row, 0] and labels.shape[1] < self.ntotal:
                out[row] = found[row][0]
        return out

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ``(scores, ids)`` per query row, ``min(k, ntotal)`` columns: never more than
        the index holds (none when it is empty), so a huge ``k`` costs nothing extra. Slots an
        approximate layout (ivf, hnsw) could not fill have id -1 and score -inf."""
        queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        width = min(max(int(k), 0), self.ntotal)
        if width == 0:
            n = queries.shape[0]
            return np.zeros((n, 0), np.float32), np.zeros((n, 0), np.int64)
        index = self._search_index()
        if index is self._index:  # concurrent CPU searches are safe in FAISS
            scores, ids = index.search(queries, width)
        else:
            with self._gpu_lock:
                scores, ids = index.search(queries, width)
        scores = np.where(ids < 0, -np.inf, scores).astype(np.float32)
        return scores, ids.astype(np.int64)

    def range_search(self, queries: np.ndarray, threshold: float, *, nprobe: int = 0
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query row, ``(ids, scores)`` of every vector with score >= ``threshold`` (CPU).
        ``nprobe`` > 0 searches that many lists of an IVF layout instead of the index's own
        (per call, so searches beside it are unaffected); flat and HNSW layouts ignore it."""
        queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        if self.ntotal == 0 or len(queries) == 0:
            return [(np.zeros(0, np.int64), np.zeros(0, np.float32)) for _ in range(len(queries))]
        if self.layout == "flat":
            return self._flat_range_search(queries, threshold)
        params = None
        if self.layout == "ivf":
            nlist = int(self._inner.nlist)
            probes = min(int(nprobe), nlist) if nprobe > 0 else int(self._inner.nprobe)
            if nprobe > 0:
                params = self._faiss.SearchParametersIVF(nprobe=probes)
            if len(queries) * probes >= IVF_BLAS_QUERIES_PER_LIST * nlist and self._blas_decodable():
                return [hit for lo in range(0, len(queries), RANGE_BATCH)  # bounded score matrices
                        for hit in self._ivf_range_search(queries[lo:lo + RANGE_BATCH], threshold, probes)]
        out = []
        for lo in range(0, len(queries), RANGE_BATCH):  # bounded result buffers on any batch size
            part = queries[lo:lo + RANGE_BATCH]
            lims, scores, ids = self._index.range_search(part, float(threshold) - 1e-6, params=params)
            for q in range(len(part)):
                s, i = scores[lims[q]:lims[q + 1]], ids[lims[q]:lims[q + 1]].astype(np.int64)
                keep = s >= threshold
                out.append((i[keep], s[keep]))
        return out

    def _flat_range_search(self, queries: np.ndarray, threshold: float) -> list[tuple[np.ndarray, np.ndarray]]:
        """:meth:`range_search` over the flat layout as blocked matrix products (BLAS) on the
        stored vectors, read in place: FAISS's flat range search computes its products without
        BLAS, 5-9x slower for a batch of names against 31k (build's synonym search). Up to
        :data:`FLAT_RANGE_ROWS` queries at a time meet the stored vectors in slices of columns,
        so each slice is read from memory once per group of queries, not once per few rows, and
        the scores above the threshold are picked out by :func:`~hipgraph.store.scan.pairs_at_least`."""
        n, d = int(self._inner.ntotal), self.dimension
        stored = self._faiss.rev_swig_ptr(self._inner.get_xb(), n * d).reshape(n, d)
        ids = self._faiss.vector_to_array(self._index.id_map).astype(np.int64, copy=False)
        limit = np.float32(threshold)  # as numpy compares a float32 matrix with a Python float
        out = []
        for lo in range(0, len(queries), FLAT_RANGE_ROWS):
            group = queries[lo:lo + FLAT_RANGE_ROWS]
            width = max(256, FLAT_RANGE_BLOCK // len(group))  # bounded score matrices on any size
            rows, cols, found = [], [], []
            for start in range(0, n, width):
                scores = group @ stored[start:start + width].T
                r, c = pairs_at_least(scores, limit)
                rows.append(r)
                cols.append(c + start)
                found.append(scores[r, c])
            r, c, s = np.concatenate(rows), np.concatenate(cols), np.concatenate(found)
            # by query; within one, slice by slice: stored positions ascending, as one product gives
            order = np.argsort(r, kind="stable")
            out.extend(_per_query(r[order], ids[c[order]], s[order], len(group)))
        return out

    def _blas_decodable(self) -> bool:
        """Whether :meth:`_ivf_range_search` can read this IVF layout's lists: float lists, or
        8-bit scalar-quantized ones (the layouts :meth:`_new_index` builds)."""
        faiss, inner = self._faiss, self._inner
        if not isinstance(faiss.downcast_InvertedLists(inner.invlists), faiss.ArrayInvertedLists):
            return False  # lists not held in memory (e.g. memory-mapped): FAISS reads them
        if isinstance(inner, faiss.IndexIVFFlat):
            return True
        return (isinstance(inner, faiss.IndexIVFScalarQuantizer)
                and inner.sq.qtype == faiss.ScalarQuantizer.QT_8bit and inner.sq.bits == 8)

    def _ivf_range_search(self, queries: np.ndarray, threshold: float, nprobe: int
                          ) -> list[tuple[np.ndarray, np.ndarray]]:
        """:meth:`range_search` over an IVF layout as one matrix product (BLAS) per probed list.

        The same lists as FAISS's range search (the quantizer's ``nprobe`` best per query) and
        the same scores up to float rounding: an SQ8 code decodes to ``vmin + (code + 0.5) *
        vdiff / 255`` per dimension (FAISS's 8-bit non-uniform codec), so the query's product
        with it is ``q @ vmin + 0.5 * sum(q * vdiff / 255)`` plus ``(q * vdiff / 255) @ code``,
        and residual codes add the query's product with the list's centroid, which the quantizer
        search returns. FAISS scans each list once per query (memory-bound); here the queries
        that probe one list share its codes (``benchmarks/synonym_search.py --batches``: about
        3x faster for 4,096 new names against 276k). Results per query are sorted by id.
        """
        faiss, inner = self._faiss, self._inner
        m, d = queries.shape
        coarse, lists = inner.quantizer.search(queries, nprobe)
        lists, coarse = lists.ravel(), coarse.ravel()
        rows = np.repeat(np.arange(m), nprobe)
        order = np.argsort(lists, kind="stable")
        lists, rows, coarse = lists[order], rows[order], coarse[order]
        valid = lists >= 0  # a list the quantizer could not fill
        lists, rows, coarse = lists[valid], rows[valid], coarse[valid]
        float_lists = isinstance(inner, faiss.IndexIVFFlat)
        if not float_lists:  # 8-bit scalar-quantized (_blas_decodable)
            trained = faiss.vector_to_array(inner.sq.trained)
            vmin, vdiff = trained[:d], trained[d:]
            scaled = np.ascontiguousarray(queries * (vdiff / 255.0)[None, :], dtype=np.float32)
            base = (queries @ vmin + 0.5 * scaled.sum(axis=1))[rows]  # per (query, list) pair
            if inner.by_residual:
                base = base + coarse
        else:
            scaled, base = queries, np.zeros(len(rows), np.float32)
        invlists, code_size = inner.invlists, int(inner.code_size)
        id_map = faiss.vector_to_array(self._index.id_map)
        starts = np.flatnonzero(np.r_[True, lists[1:] != lists[:-1]]) if len(lists) else np.zeros(0, np.int64)
        ends = np.r_[starts[1:], len(lists)]
        found_rows, found_ids, found_scores = [], [], []
        gathered = np.empty((int((ends - starts).max(initial=0)), d), np.float32)  # one buffer, reused
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            list_no = int(lists[a])
            size = int(invlists.list_size(list_no))
            if size == 0:
                continue
            codes = faiss.rev_swig_ptr(invlists.get_codes(list_no), size * code_size)
            if float_lists:
                stored = codes.view(np.float32).reshape(size, d)
            else:
                stored = codes.reshape(size, code_size).astype(np.float32)
            internal = faiss.rev_swig_ptr(invlists.get_ids(list_no), size)
            probing = rows[a:b]
            scores = np.take(scaled, probing, axis=0, out=gathered[:b - a]) @ stored.T
            hits = scores >= (threshold - 1e-6 - base[a:b])[:, None]
            if not hits.any():
                continue
            r, c = np.nonzero(hits)
            score = scores[r, c] + base[a:b][r]
            keep = score >= threshold  # decided on the score returned, as FAISS's path does
            if keep.any():
                found_rows.append(probing[r[keep]])
                found_ids.append(id_map[internal[c[keep]]])
                found_scores.append(score[keep])
        if not found_rows:
            return [(np.zeros(0, np.int64), np.zeros(0, np.float32)) for _ in range(m)]
        found_rows, found_ids = np.concatenate(found_rows), np.concatenate(found_ids).astype(np.int64)
        found_scores = np.concatenate(found_scores).astype(np.float32)
        order = np.lexsort((found_ids, found_rows))
        return _per_query(found_rows[order], found_ids[order], found_scores[order], m)

    def _search_index(self):
        if self.config.use_gpu == "never" or self.layout == "hnsw":
            return self._index
        if self._gpu_index is None and gpu_count() > 0:
            with self._gpu_lock:
                if self._gpu_index is None:
                    try:
                        self._gpu_index = self._faiss.index_cpu_to_all_gpus(self._index)
                    except RuntimeError:
                        logger.warning("FAISS could not move the index to GPU; searching on CPU",
                                       exc_info=True)
                        self._gpu_index = self._index
        gpu = self._gpu_index
        return gpu if gpu is not None else self._index

    @property
    def on_gpu(self) -> bool:
        return self._gpu_index is not None and self._gpu_index is not self._index

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> None:
        """Write atomically: a temporary file in the same folder, fsync, then rename."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self._faiss.write_index(self._index, str(tmp))
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except (RuntimeError, OSError) as exc:  # e.g. disk full: the previous file stays
            tmp.unlink(missing_ok=True)
            raise StoreError(f"cannot write FAISS file {path}: {exc}") from exc
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    @classmethod
    def load(cls, path: str | Path, dimension: int, config: VectorIndexConfig | None = None) -> FaissVectorIndex:
        """Read a saved index; raises :class:`StoreError` when unreadable or of another shape."""
        obj = cls(dimension, config)
        try:
            index = obj._faiss.read_index(str(path))
        except RuntimeError as exc:
            raise StoreError(f"cannot read FAISS file {path}: {exc}") from exc
        if index.d != obj.dimension:
            raise StoreError(f"FAISS file {path} has dimension {index.d}, expected {obj.dimension}")
        if not isinstance(index, obj._faiss.IndexIDMap2):
            index = obj._faiss.downcast_index(index)
        if not hasattr(index, "id_map"):
            raise StoreError(f"FAISS file {path} is not an id-mapped index")
        obj._index = index
        obj._inner = obj._faiss.downcast_index(index.index)
        if hasattr(obj._inner, "nprobe"):
            obj._inner.nprobe = obj.config.nprobe(obj._inner.nlist)
            obj.trained_on = obj.ntotal  # retrained once grown retrain_growth times past this
        return obj
