"""CSR construction and graph preparation: :func:`to_csr`, :class:`PPRGraph`, :func:`prepare_graph`.

:func:`prepare_graph` validates a CSR graph once and precomputes what the solvers read: the
out-weights, the dangling set, and either the symmetric scaling (conjugate gradients, see
``cg.py``) or the transpose with transition probabilities (power iteration, see ``power.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from hipgraph.query.ppr.runtime import _choose_threading_layer, parallel_launch


def to_csr(
    n: int,
    src: np.ndarray,
    dst: np.ndarray,
    weight: np.ndarray | None = None,
    *,
    undirected: bool = True,
    n_cols: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Build ``(indptr, indices, weights)`` with row ``u`` holding ``u``'s out-edges.

    ``undirected=True`` adds every edge in both directions (a self-loop is added once).
    ``n_cols`` makes a rectangular ``n x n_cols`` matrix (directed only; default square).
    Duplicate edges are merged by summing their weights; ``weight=None`` means all ones.
    Returns ``indptr`` int64 ``(n + 1,)``, ``indices`` int32 and ``weights`` float64, with
    the column indices sorted inside each row.
    """
    n = int(n)
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    m = n if n_cols is None else int(n_cols)
    if m < 0 or (undirected and m != n):
        raise ValueError(f"n_cols must be non-negative and, for an undirected graph, equal n; got {n_cols}")
    src = np.asarray(src).reshape(-1)
    dst = np.asarray(dst).reshape(-1)
    if src.shape != dst.shape:
        raise ValueError(f"src and dst must have the same length, got {src.size} and {dst.size}")
    if src.size and not (np.issubdtype(src.dtype, np.integer) and np.issubdtype(dst.dtype, np.integer)):
        raise ValueError("src and dst must be integer node ids")
    if src.dtype not in (np.int32, np.int64):  # the kernel is compiled for these two
        src = src.astype(np.int64)
    if dst.dtype not in (np.int32, np.int64):
        dst = dst.astype(np.int64)
    if weight is None:
        w = np.ones(src.size, dtype=np.float64)
    else:
        w = np.asarray(weight, dtype=np.float64).reshape(-1)
        if w.shape != src.shape:
            raise ValueError(f"weight must have one value per edge ({src.size}), got {w.size}")
    if src.size:
        for ids, bound, what in ((src, n, "row"), (dst, m, "column")):
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= bound:
                raise ValueError(f"{what} node ids must lie in [0, {bound}), found range [{lo}, {hi}]")
    if not np.all(np.isfinite(w)):
        raise ValueError("edge weights must be finite")
    if np.any(w < 0):
        raise ValueError("edge weights must be non-negative")
    return _coo_to_csr(n, src, dst, w, undirected)


@njit(cache=True, nogil=True)
def _sort_row(cols, vals):
    """Stable sort of one row's ``cols`` (and ``vals`` with them), in place."""
    k = cols.size
    if k <= 32:  # insertion sort: most rows are short
        for i in range(1, k):
            c, v = cols[i], vals[i]
            j = i - 1
            while j >= 0 and cols[j] > c:
                cols[j + 1] = cols[j]
                vals[j + 1] = vals[j]
                j -= 1
            cols[j + 1] = c
            vals[j + 1] = v
        return
    order = np.argsort(cols, kind="mergesort")
    cols[:] = cols[order]
    vals[:] = vals[order]


@njit(cache=True, nogil=True)
def _coo_to_csr(n, src, dst, w, undirected):
    """Counting sort of the edges by row, then each row sorted by column with duplicates summed
    in input order (the forward edges first, then the reversed ones, as if concatenated): no
    array larger than the directed edges is made, nor any int64 one of that size."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    for e in range(src.size):
        ptr[src[e] + 1] += 1
        if undirected and src[e] != dst[e]:
            ptr[dst[e] + 1] += 1
    for i in range(n):
        ptr[i + 1] += ptr[i]
    fill = ptr[:-1].copy()
    cols = np.empty(ptr[n], dtype=np.int32)
    vals = np.empty(ptr[n], dtype=np.float64)
    for e in range(src.size):
        pos = fill[src[e]]
        cols[pos] = dst[e]
        vals[pos] = w[e]
        fill[src[e]] = pos + 1
    if undirected:
        for e in range(src.size):
            if src[e] != dst[e]:
                pos = fill[dst[e]]
                cols[pos] = src[e]
                vals[pos] = w[e]
                fill[dst[e]] = pos + 1
    indptr = np.zeros(n + 1, dtype=np.int64)
    out = 0
    for u in range(n):
        lo, hi = ptr[u], ptr[u + 1]
        _sort_row(cols[lo:hi], vals[lo:hi])
        e = lo
        while e < hi:  # out <= e: the merged row moves left in place
            c = cols[e]
            s = 0.0
            while e < hi and cols[e] == c:
                s += vals[e]
                e += 1
            cols[out] = c
            vals[out] = s
            out += 1
        indptr[u + 1] = out
    return indptr, cols[:out].copy(), vals[:out].copy()


@njit(cache=True, nogil=True)
def _transpose(indptr, indices, weights, n):
    """CSR of the transpose (rows = in-edges, columns sorted), keeping weights as given."""
    m = indices.size
    tptr = np.zeros(n + 1, dtype=np.int64)
    for e in range(m):
        tptr[indices[e] + 1] += 1
    for i in range(n):
        tptr[i + 1] += tptr[i]
    fill = tptr[:-1].copy()
    tidx = np.empty(m, dtype=np.int32)
    tw = np.empty(m, dtype=weights.dtype)
    for u in range(n):
        for e in range(indptr[u], indptr[u + 1]):
            v = indices[e]
            pos = fill[v]
            tidx[pos] = u
            tw[pos] = weights[e]
            fill[v] = pos + 1
    return tptr, tidx, tw


@njit(parallel=True, cache=True, nogil=True)
def _row_sums(indptr, w32):
    n = indptr.size - 1
    out = np.zeros(n)
    for u in prange(n):
        s = 0.0
        for e in range(indptr[u], indptr[u + 1]):
            s += np.float64(w32[e])
        out[u] = s
    return out


@njit(parallel=True, cache=True, nogil=True)
def _in_probs(tptr, tidx, tw, outw):
    """Transition probability of every in-edge ``j -> i``: ``w / out-weight(j)`` as float32."""
    n = tptr.size - 1
    out = np.empty(tidx.size, dtype=np.float32)
    for i in prange(n):
        for e in range(tptr[i], tptr[i + 1]):
            ow = outw[tidx[e]]
            out[e] = np.float32(np.float64(tw[e]) / ow) if ow > 0.0 else np.float32(0.0)
    return out


@njit(parallel=True, cache=True, nogil=True)
def _sym_values(indptr, indices, w32, outw):
    """``w[i, j] / sqrt(out_weight[i] * out_weight[j])`` per CSR entry, as float32 (symmetric
    in ``i, j`` exactly, so the matrix it forms is exactly symmetric)."""
    n = indptr.size - 1
    isq = np.zeros(n)
    for i in prange(n):
        if outw[i] > 0.0:
            isq[i] = 1.0 / np.sqrt(outw[i])
    out = np.empty(indices.size, dtype=np.float32)
    for i in prange(n):
        for e in range(indptr[i], indptr[i + 1]):
            out[e] = np.float32(np.float64(w32[e]) * (isq[i] * isq[indices[e]]))
    return out


@dataclass(frozen=True, eq=False)
class PPRGraph:
    """A CSR graph prepared once for many PPR queries (out-weights, transpose, dangling set).

    Built by :func:`prepare_graph`; every array may be a read-only numpy memmap.

    ``n``: number of nodes.  ``indptr`` int64 ``(n + 1,)``, ``indices`` int32 ``(m,)`` and
    ``weights`` float32 ``(m,)``: the out-edge CSR (row ``u`` = edges ``u -> v``), used by
    push.  ``out_weight`` float64 ``(n,)``: row sums of ``weights`` (0 for dangling nodes),
    ``sqrt_out``: its square roots.  ``dangling`` int64: ids of the nodes with zero
    out-weight.  ``symmetric``: the CSR equals its transpose.

    Exact solver data: for a symmetric graph ``sym_weight`` float32 ``(m,)`` holds
    ``w(u, v) / sqrt(out_weight[u] * out_weight[v])`` in CSR order (conjugate gradients on
    that symmetric matrix), and ``tindptr`` / ``tindices`` are the very arrays ``indptr`` /
    ``indices`` while ``tprob`` is empty.  Otherwise ``tindptr`` / ``tindices`` are the
    in-edge CSR (row ``i`` = edges ``j -> i``), ``tprob`` float32 ``(m,)`` the transition
    probability ``w(j -> i) / out_weight[j]`` of each in-edge (power iteration), and
    ``sym_weight`` is empty.
    """

    n: int
    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray
    out_weight: np.ndarray
    dangling: np.ndarray
    tindptr: np.ndarray
    tindices: np.ndarray
    tprob: np.ndarray
    symmetric: bool
    sqrt_out: np.ndarray
    sym_weight: np.ndarray

    @property
    def m(self) -> int:
        """Number of directed edges (CSR entries)."""
        return int(self.indices.size)

    def __repr__(self) -> str:
        return (
            f"PPRGraph(n={self.n}, m={self.m}, symmetric={self.symmetric}, "
            f"dangling={self.dangling.size})"
        )


def prepare_graph(
    indptr: np.ndarray,
    indices: np.ndarray,
    weights: np.ndarray,
    *,
    symmetric: bool | None = None,
    validate: bool = True,
) -> PPRGraph:
    """Validate a CSR graph once and precompute what every PPR query needs.

    ``indptr, indices, weights``: CSR with row ``u`` holding ``u``'s out-edges (see
    :func:`to_csr`); weights must be finite and non-negative.  ``symmetric=True`` means the
    CSR equals its transpose (an undirected graph passed with both directions, as
    ``to_csr(undirected=True)`` builds), so no transpose is built (only in/out degrees are
    checked); ``False`` always builds the transpose; ``None`` detects it.  Arrays that already
    have the kernel dtypes (int64 / int32 / float32) are used without copying, so memmaps stay
    memmaps. ``validate=False`` skips the checks that read every edge (index range, finite and
    non-negative weights, equal in/out degrees): for arrays hipgraph built or verified itself.
    """
    _choose_threading_layer()
    indptr = np.asarray(indptr)
    indices = np.asarray(indices)
    weights = np.asarray(weights)
    if indptr.ndim != 1 or indptr.size < 1:
        raise ValueError("indptr must be a 1-D array of length n + 1")
    if indices.ndim != 1 or weights.ndim != 1:
        raise ValueError("indices and weights must be 1-D arrays")
    for name, arr in (("indptr", indptr), ("indices", indices)):
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{name} must be an integer array, got dtype {arr.dtype}")
    n = indptr.size - 1
    m = indices.size
    if weights.size != m:
        raise ValueError(f"weights has {weights.size} entries but indices has {m}")
    indptr = indptr.astype(np.int64, copy=False)
    if indptr[0] != 0 or indptr[-1] != m:
        raise ValueError(f"indptr must start at 0 and end at len(indices)={m}")
    if n and np.any(np.diff(indptr) < 0):
        raise ValueError("indptr must be non-decreasing")
    if validate and m and (indices.min() < 0 or indices.max() >= n):
        raise ValueError(f"indices must lie in [0, {n})")
    if n >= 2**31:
        raise ValueError(f"at most 2**31 - 1 nodes are supported, got {n}")
    indices = indices.astype(np.int32, copy=False)
    if np.iscomplexobj(weights):
        raise ValueError("weights must be real numbers")
    try:
        w32 = weights.astype(np.float32, copy=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"weights must be numeric: {exc}") from None
    if validate and not np.all(np.isfinite(w32)):
        raise ValueError("weights must be finite (and fit in float32)")
    if validate and np.any(w32 < 0):
        raise ValueError("weights must be non-negative")

    with parallel_launch():
        outw = _row_sums(indptr, w32)
    dangling = np.flatnonzero(outw <= 0).astype(np.int64)
    if symmetric is None or not symmetric:
        tptr, tidx, tw = _transpose(indptr, indices, w32, n)
        if symmetric is None:
            symmetric = bool(
                np.array_equal(indptr, tptr)
                and np.array_equal(indices, tidx)
                and np.array_equal(w32, tw)
            )
    elif validate and m and np.any(np.bincount(indices, minlength=n) != np.diff(indptr)):
        raise ValueError("symmetric=True but in-degrees differ from out-degrees")
    sqrt_out = np.sqrt(outw)
    empty = np.zeros(0, dtype=np.float32)
    if symmetric:
        tptr, tidx, tprob = indptr, indices, empty
        with parallel_launch():
            sym_weight = _sym_values(indptr, indices, w32, outw)
    else:
        with parallel_launch():
            tprob = _in_probs(tptr, tidx, tw, outw)
        sym_weight = empty
    return PPRGraph(
        n=n, indptr=indptr, indices=indices, weights=w32, out_weight=outw, dangling=dangling,
        tindptr=tptr, tindices=tidx, tprob=tprob, symmetric=bool(symmetric), sqrt_out=sqrt_out,
        sym_weight=sym_weight,
    )
