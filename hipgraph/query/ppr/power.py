"""Pull power iteration over the transpose (exact PPR on graphs that are not symmetric).

Each sweep computes ``x <- damping * P^T x + (dangling mass + 1 - damping) * r`` from the
in-edge CSR with pre-divided float32 transition probabilities (:attr:`PPRGraph.tprob`) and
stops once the L1 change of every vector is below ``tol``.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from hipgraph.query.ppr.prepare import PPRGraph
from hipgraph.query.ppr.runtime import _U, _edge_bounds, parallel_launch


@njit(cache=True, nogil=True)
def _pull_rows(lo, hi, tptr, tidx, tp, r, x, y, damping, coef):
    """``y[i] = damping * sum_j P[j, i] x[j] + coef * r[i]`` for ``lo <= i < hi``; returns the
    L1 change ``sum |y[i] - x[i]|`` over those rows."""
    part = 0.0
    for i in range(lo, hi):
        acc = 0.0
        for e in range(_U(tptr[i]), _U(tptr[i + 1])):
            acc += tp[e] * x[_U(tidx[e])]
        v = damping * acc + coef * r[i]
        part += abs(v - x[i])
        y[i] = v
    return part


@njit(cache=True, nogil=True)
def _dangling_coef(dangling, x, damping):
    dm = 0.0
    for t in range(dangling.size):
        dm += x[dangling[t]]
    return damping * dm + (1.0 - damping)


@njit(cache=True, nogil=True)
def _pull_1(tptr, tidx, tp, dangling, r, x, damping, tol, max_iter):
    """Serial pull power iteration for one vector from the start ``x``; returns
    ``(x, iterations)``.

    ``tptr/tidx/tp``: in-edge CSR with transition probabilities (float32), ``dangling``: ids of
    nodes without out-weight, ``r``: normalised reset.
    """
    n = r.size
    y = np.empty(n)
    it = 0
    while it < max_iter:
        it += 1
        coef = _dangling_coef(dangling, x, damping)
        err = _pull_rows(0, n, tptr, tidx, tp, r, x, y, damping, coef)
        x, y = y, x
        if err < tol:
            break
    return x, it


@njit(parallel=True, cache=True, nogil=True)
def _pull_b(tptr, tidx, tp, dangling, bounds, r, rnz, x, damping, tol, max_iter):
    """Pull power iteration on ``(n, b)`` vectors (batch innermost); returns ``(x, its)``.

    ``rnz[i]`` is False where row ``i`` of ``r`` is all zero (its reset term is skipped).
    """
    n, b = x.shape
    nchunks = bounds.size - 1
    y = np.empty_like(x)
    partial = np.zeros((nchunks, b))
    coef = np.empty(b)
    acc_all = np.empty((nchunks, b))
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
            acc = acc_all[c]
            part = partial[c]
            for k in range(b):
                part[k] = 0.0
            for i in range(bounds[c], bounds[c + 1]):
                for k in range(b):
                    acc[k] = 0.0
                for e in range(_U(tptr[i]), _U(tptr[i + 1])):
                    j = _U(tidx[e])
                    w = np.float64(tp[e])
                    for k in range(b):
                        acc[k] += w * x[j, k]
                if rnz[i]:
                    for k in range(b):
                        v = damping * acc[k] + coef[k] * r[i, k]
                        part[k] += abs(v - x[i, k])
                        y[i, k] = v
                else:
                    for k in range(b):
                        v = damping * acc[k]
                        part[k] += abs(v - x[i, k])
                        y[i, k] = v
        x, y = y, x
        err = 0.0
        for k in range(b):
            tot = 0.0
            for c in range(nchunks):
                tot += partial[c, k]
            err = max(err, tot)
        if err < tol:
            break
    return x, it


def _pull_solve(g: PPRGraph, r_norm, damping, tol, max_iter):
    """Power iteration for normalised ``(b, n)`` resets on a graph that is not symmetric;
    returns ``(unnormalised result (b, n), iterations)``."""
    b, n = r_norm.shape
    if b == 1:
        r = np.ascontiguousarray(r_norm[0])
        x, it = _pull_1(
            g.tindptr, g.tindices, g.tprob, g.dangling, r, r.copy(), damping, tol, max_iter
        )
        return x.reshape(1, n), it
    bounds = _edge_bounds(g.tindptr, 4 * numba.get_num_threads())
    r_t = np.ascontiguousarray(r_norm.T)
    rnz = r_t.any(axis=1)
    with parallel_launch():
        x, it = _pull_b(
            g.tindptr, g.tindices, g.tprob, g.dangling, bounds, r_t, rnz, r_t.copy(), damping,
            tol, max_iter,
        )
    return np.ascontiguousarray(x.T), it
