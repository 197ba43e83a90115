"""Personalized PageRank over a CSR graph: exact power iteration and local forward push.

Semantics follow ``igraph.Graph.personalized_pagerank(directed=True, weights=..., reset=...)``:

    x = (1 - d) * r + d * (P^T x + (mass on dangling nodes) * r)

where ``P`` is the row-normalised weighted adjacency (CSR rows are out-edges), ``r`` the
normalised reset distribution and dangling nodes (no out-weight) jump back to ``r``.

Kernels are pure functions over arrays compiled with numba.  The exact method pulls over the
transpose CSR with the batch dimension innermost, so a ``(b, n)`` reset streams the graph once
per iteration for all ``b`` vectors.  Edge weights are streamed as float32 (the out-weights are
summed from those float32 values, so the transition matrix stays exactly stochastic); the
vectors and all accumulations are float64.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

__all__ = ["personalized_pagerank", "to_csr"]

_METHODS = ("power", "push")


# --------------------------------------------------------------------------------------------
# CSR construction
# --------------------------------------------------------------------------------------------


def to_csr(
    n: int,
    src: np.ndarray,
    dst: np.ndarray,
    weight: np.ndarray | None = None,
    *,
    undirected: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Build ``(indptr, indices, weights)`` with row ``u`` holding ``u``'s out-edges.

    ``undirected=True`` adds every edge in both directions (a self-loop is added once).
    Duplicate edges are merged by summing their weights; ``weight=None`` means all ones.
    Returns ``indptr`` int64 ``(n + 1,)``, ``indices`` int32 and ``weights`` float64, with
    the column indices sorted inside each row.
    """
    n = int(n)
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    src = np.asarray(src).reshape(-1)
    dst = np.asarray(dst).reshape(-1)
    if src.shape != dst.shape:
        raise ValueError(f"src and dst must have the same length, got {src.size} and {dst.size}")
    if src.size and not (np.issubdtype(src.dtype, np.integer) and np.issubdtype(dst.dtype, np.integer)):
        raise ValueError("src and dst must be integer node ids")
    src = src.astype(np.int64, copy=False)
    dst = dst.astype(np.int64, copy=False)
    if weight is None:
        w = np.ones(src.size, dtype=np.float64)
    else:
        w = np.asarray(weight, dtype=np.float64).reshape(-1)
        if w.shape != src.shape:
            raise ValueError(f"weight must have one value per edge ({src.size}), got {w.size}")
    if src.size:
        lo = min(int(src.min()), int(dst.min()))
        hi = max(int(src.max()), int(dst.max()))
        if lo < 0 or hi >= n:
            raise ValueError(f"node ids must lie in [0, {n}), found range [{lo}, {hi}]")
    if not np.all(np.isfinite(w)):
        raise ValueError("edge weights must be finite")
    if np.any(w < 0):
        raise ValueError("edge weights must be non-negative")
    if undirected:
        off = src != dst
        src, dst = np.concatenate([src, dst[off]]), np.concatenate([dst, src[off]])
        w = np.concatenate([w, w[off]])
    key = src * max(n, 1) + dst
    uniq, inv = np.unique(key, return_inverse=True)
    wsum = np.bincount(inv.reshape(-1), weights=w, minlength=uniq.size).astype(np.float64)
    rows = uniq // max(n, 1)
    cols = uniq - rows * max(n, 1)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    return indptr, cols.astype(np.int32), wsum


# --------------------------------------------------------------------------------------------
# Numba kernels
# --------------------------------------------------------------------------------------------


@njit(cache=True)
def _transpose(indptr, indices, weights, n):
    """CSR of the transpose (rows = in-edges), keeping weights as given."""
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


@njit(parallel=True, cache=True)
def _power_kernel(tptr, tidx, tw, inv_out, dangling, r, damping, tol, max_iter, nchunks):
    """Pull power iteration on ``(n, b)`` vectors; returns ``(x, iterations)``.

    ``tptr/tidx/tw``: transpose CSR (float32 raw weights), ``inv_out``: 1 / out-weight
    (0 for dangling nodes), ``dangling``: ids of dangling nodes, ``r``: normalised resets.
    """
    n, b = r.shape
    x = r.copy()
    y = np.empty_like(r)
    z = np.empty_like(r)
    zn = np.empty_like(r)
    for i in prange(n):
        s = inv_out[i]
        for k in range(b):
            z[i, k] = x[i, k] * s
    chunk = (n + nchunks - 1) // nchunks
    partial = np.zeros((nchunks, b))
    coef = np.empty(b)
    it = 0
    while it < max_iter:
        it += 1
        for k in range(b):
            coef[k] = 0.0
        for t in range(dangling.size):
            j = dangling[t]
            for k in range(b):
                coef[k] += x[j, k]
        for k in range(b):
            coef[k] = damping * coef[k] + (1.0 - damping)
        for c in prange(nchunks):
            lo = c * chunk
            hi = min(n, lo + chunk)
            acc = np.empty(b)
            for k in range(b):
                partial[c, k] = 0.0
            for i in range(lo, hi):
                for k in range(b):
                    acc[k] = 0.0
                for e in range(tptr[i], tptr[i + 1]):
                    j = tidx[e]
                    w = np.float64(tw[e])
                    for k in range(b):
                        acc[k] += w * z[j, k]
                s = inv_out[i]
                for k in range(b):
                    v = damping * acc[k] + coef[k] * r[i, k]
                    partial[c, k] += abs(v - x[i, k])
                    y[i, k] = v
                    zn[i, k] = v * s
        x, y = y, x
        z, zn = zn, z
        err = 0.0
        for k in range(b):
            tot = 0.0
            for c in range(nchunks):
                tot += partial[c, k]
            err = max(err, tot)
        if err < tol:
            break
    return x, it


@njit(parallel=True, cache=True)
def _power_kernel_1(tptr, tidx, tw, inv_out, dangling, r, damping, tol, max_iter):
    """Single-vector specialisation of :func:`_power_kernel` (1-D ``r``)."""
    n = r.size
    x = r.copy()
    y = np.empty_like(r)
    z = x * inv_out
    zn = np.empty_like(r)
    it = 0
    while it < max_iter:
        it += 1
        dm = 0.0
        for t in range(dangling.size):
            dm += x[dangling[t]]
        coef = damping * dm + (1.0 - damping)
        err = 0.0
        for i in prange(n):
            acc = 0.0
            for e in range(tptr[i], tptr[i + 1]):
                acc += np.float64(tw[e]) * z[tidx[e]]
            v = damping * acc + coef * r[i]
            err += abs(v - x[i])
            y[i] = v
            zn[i] = v * inv_out[i]
        x, y = y, x
        z, zn = zn, z
        if err < tol:
            break
    return x, it


@njit(parallel=True, cache=True)
def _row_sums(indptr, w32):
    n = indptr.size - 1
    out = np.zeros(n)
    for u in prange(n):
        s = 0.0
        for e in range(indptr[u], indptr[u + 1]):
            s += np.float64(w32[e])
        out[u] = s
    return out


@njit(cache=True)
def _push_row(indptr, indices, w, outw, seeds, seedw, damping, eps, p, res, inq):
    """Forward push for one reset vector; ``p``, ``res``, ``inq`` are zeroed length-n rows.

    Writes the normalised estimate into ``p`` and returns the number of pushes.  A node is
    queued when its residual exceeds ``eps * out-weight`` (``eps`` for dangling nodes, whose
    pushed mass goes back to the reset distribution).
    """
    cap = 1024
    q = np.empty(cap, dtype=np.int64)
    head = 0
    tail = 0
    touched = np.empty(cap, dtype=np.int64)
    nt = 0
    for t in range(seeds.size):
        s = seeds[t]
        res[s] += seedw[t]
        if inq[s] == 0:
            inq[s] = 1
            q, head, tail = _enqueue(q, head, tail, s)
    pushes = 0
    while head < tail:
        u = q[head]
        head += 1
        inq[u] = 0
        ru = res[u]
        if ru <= 0.0:
            continue
        pushes += 1
        res[u] = 0.0
        if p[u] == 0.0:
            if nt == touched.size:
                touched = _grow(touched, 0, nt)
            touched[nt] = u
            nt += 1
        p[u] += (1.0 - damping) * ru
        mass = damping * ru
        ow = outw[u]
        if ow > 0.0:
            scale = mass / ow
            lo = indptr[u]
            hi = indptr[u + 1]
        else:
            scale = mass
            lo = 0
            hi = seeds.size
        for e in range(lo, hi):
            if ow > 0.0:
                v = indices[e]
                res[v] += scale * w[e]
            else:
                v = seeds[e]
                res[v] += scale * seedw[e]
            if inq[v] == 0:
                thr = eps * outw[v] if outw[v] > 0.0 else eps
                if res[v] > thr:
                    inq[v] = 1
                    q, head, tail = _enqueue(q, head, tail, v)
    total = 0.0
    for t in range(nt):
        total += p[touched[t]]
    for t in range(nt):
        p[touched[t]] /= total
    return pushes


@njit(cache=True)
def _enqueue(q, head, tail, v):
    """Append ``v`` to the FIFO ``q[head:tail]``, compacting into a larger array when full."""
    if tail == q.size:
        q = _grow(q, head, tail)
        tail -= head
        head = 0
    q[tail] = v
    return q, head, tail + 1


@njit(cache=True)
def _grow(a, head, tail):
    """Copy the live part ``a[head:tail]`` to the front of an array twice as large."""
    out = np.empty(2 * a.size, dtype=a.dtype)
    out[: tail - head] = a[head:tail]
    return out


@njit(parallel=True, cache=True)
def _push_batch(indptr, indices, w, outw, seed_ptr, seeds, seedw, damping, eps, p, res, inq):
    b = seed_ptr.size - 1
    pushes = np.zeros(b, dtype=np.int64)
    for q in prange(b):
        lo = seed_ptr[q]
        hi = seed_ptr[q + 1]
        pushes[q] = _push_row(
            indptr, indices, w, outw, seeds[lo:hi], seedw[lo:hi], damping, eps,
            p[q], res[q], inq[q],
        )
    return pushes


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def _validate(indptr, indices, weights, reset, damping, tol, max_iter, method, eps):
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
    if m and (indices.min() < 0 or indices.max() >= n):
        raise ValueError(f"indices must lie in [0, {n})")
    indices = indices.astype(np.int32, copy=False)
    try:
        weights = weights.astype(np.float64, copy=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"weights must be numeric: {exc}") from None
    if not np.all(np.isfinite(weights)):
        raise ValueError("weights must be finite")
    if np.any(weights < 0):
        raise ValueError("weights must be non-negative")

    reset = np.asarray(reset)
    if reset.ndim not in (1, 2):
        raise ValueError(f"reset must have shape (n,) or (b, n), got {reset.shape}")
    if reset.shape[-1] != n:
        raise ValueError(f"reset has {reset.shape[-1]} columns but the graph has {n} nodes")
    try:
        reset = reset.astype(np.float64, copy=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"reset must be numeric: {exc}") from None
    if not np.all(np.isfinite(reset)):
        raise ValueError("reset must be finite")
    if np.any(reset < 0):
        raise ValueError("reset must be non-negative")
    r2 = reset.reshape(-1, n)
    sums = r2.sum(axis=1)
    zero = np.flatnonzero(sums <= 0)
    if zero.size:
        raise ValueError(f"reset row {int(zero[0])} sums to zero; every row needs positive mass")

    damping = float(damping)
    if not 0.0 <= damping < 1.0:
        raise ValueError(f"damping must lie in [0, 1), got {damping}")
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    tol = float(tol)
    if not tol > 0:
        raise ValueError(f"tol must be positive, got {tol}")
    if int(max_iter) != max_iter or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter}")
    eps = float(eps)
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    return indptr, indices, weights, reset, r2 / sums[:, None], n, damping, tol, int(max_iter), eps


def _out_weights(indptr, w32, n):
    """Out-weight per node, summed in float64 from the float32 weights the kernels use."""
    return _row_sums(indptr, w32)


def _power(indptr, indices, w32, r_norm, damping, tol, max_iter):
    """Exact PPR for normalised ``(b, n)`` resets; returns ``(result (b, n), iterations)``."""
    n = indptr.size - 1
    outw = _out_weights(indptr, w32, n)
    inv_out = np.zeros(n)
    np.divide(1.0, outw, out=inv_out, where=outw > 0)
    dangling = np.flatnonzero(outw <= 0).astype(np.int64)
    tptr, tidx, tw = _transpose(indptr, indices, w32, n)
    if r_norm.shape[0] == 1:
        x, it = _power_kernel_1(
            tptr, tidx, tw, inv_out, dangling, np.ascontiguousarray(r_norm[0]), damping, tol,
            max_iter,
        )
        out = x.reshape(1, n)
    else:
        nchunks = max(1, min(n, 8 * numba.get_num_threads()))
        r_t = np.ascontiguousarray(r_norm.T)
        x, it = _power_kernel(
            tptr, tidx, tw, inv_out, dangling, r_t, damping, tol, max_iter, nchunks
        )
        out = np.ascontiguousarray(x.T)
    out /= out.sum(axis=1, keepdims=True)
    return out, it


def _push(indptr, indices, w32, r_norm, damping, eps):
    """Forward-push PPR for normalised ``(b, n)`` resets; returns ``(result, pushes)``."""
    b, n = r_norm.shape
    outw = _out_weights(indptr, w32, n)
    rows, cols = np.nonzero(r_norm)
    seed_ptr = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=b), out=seed_ptr[1:])
    seeds = cols.astype(np.int64)
    seedw = r_norm[rows, cols]
    p = np.zeros((b, n))
    res = np.zeros((b, n))
    inq = np.zeros((b, n), dtype=np.uint8)
    pushes = _push_batch(
        indptr, indices, w32, outw, seed_ptr, seeds, seedw, damping, eps, p, res, inq
    )
    return p, pushes


def personalized_pagerank(
    indptr: np.ndarray,
    indices: np.ndarray,
    weights: np.ndarray,
    reset: np.ndarray,
    *,
    damping: float = 0.5,
    tol: float = 1e-8,
    max_iter: int = 100,
    method: str = "power",
    eps: float = 1e-6,
) -> np.ndarray:
    """Personalized PageRank of every reset row over a weighted directed CSR graph.

    ``indptr, indices, weights``: CSR with row ``u`` holding ``u``'s out-edges (pass both
    directions for an undirected graph, see :func:`to_csr`).  ``reset``: ``(n,)`` or
    ``(b, n)`` non-negative weights, normalised per row here.  ``damping`` is the probability
    of following an edge; dangling nodes send their mass back to the reset distribution.

    ``method="power"`` iterates until the L1 change of every row is below ``tol`` (or
    ``max_iter``); ``b`` rows share one pass over the graph per iteration.
    ``method="push"`` runs a local forward push (residual threshold ``eps * out-weight``),
    whose cost depends on the touched neighbourhood only.

    Returns float64 scores with the shape of ``reset``, each row summing to 1.
    """
    indptr, indices, weights, reset, r_norm, n, damping, tol, max_iter, eps = _validate(
        indptr, indices, weights, reset, damping, tol, max_iter, method, eps
    )
    w32 = weights.astype(np.float32)
    if method == "power":
        out, _ = _power(indptr, indices, w32, r_norm, damping, tol, max_iter)
    else:
        out, _ = _push(indptr, indices, w32, r_norm, damping, eps)
    return out.reshape(reset.shape)
