"""Forward push: approximate, local PPR (``method="push"``, see :func:`ppr`).

A node is pushed while its residual exceeds ``eps * out-weight``, so the cost depends on the
touched neighbourhood, not on ``n``; the ``_REFINE`` best estimates then get one more step of
the residual along their in-edges (top-k accuracy).  Rows of a batch are pushed in parallel.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from hipgraph.query.ppr.prepare import PPRGraph
from hipgraph.query.ppr.runtime import _U, parallel_launch

_REFINE = 64  # the best estimates refined by one more residual step (top-k accuracy)


@njit(cache=True, nogil=True)
def _nonzeros(r2, sums):
    """Nonzero entries of every row as CSR ``(ptr, cols, values / row sum)``."""
    b, n = r2.shape
    ptr = np.zeros(b + 1, dtype=np.int64)
    for k in range(b):
        c = 0
        for i in range(n):
            if r2[k, i] != 0.0:
                c += 1
        ptr[k + 1] = ptr[k] + c
    cols = np.empty(ptr[b], dtype=np.int64)
    vals = np.empty(ptr[b])
    for k in range(b):
        t = ptr[k]
        inv = 1.0 / sums[k]
        for i in range(n):
            v = r2[k, i]
            if v != 0.0:
                cols[t] = i
                vals[t] = v * inv
                t += 1
    return ptr, cols, vals


@njit(cache=True, nogil=True)
def _push_row(
    indptr, indices, w, outw, in_ptr, in_idx, in_val, in_outw, seeds, seedw, damping, eps, out
):
    """Forward push for one reset (``seeds`` with normalised weights ``seedw``).

    A node is pushed while its residual exceeds ``eps * out-weight`` (``eps * 1`` for dangling
    nodes, whose pushed mass goes back to the reset distribution).  Writes the normalised
    estimate ``p + (1 - damping) * residual`` into the zeroed row ``out``, where the
    ``_REFINE`` largest entries also get the residual's next step along the in-edges
    (``in_ptr / in_idx / in_val``: weights with ``in_outw`` the out-weights of the sources, or
    transition probabilities when ``in_outw`` is empty).  Returns the number of pushes.
    """
    n = outw.size
    res = np.zeros(n)
    flag = np.zeros(n, dtype=np.uint8)  # 1: touched (has p or residual mass), 2: queued
    cap = n + 1
    q = np.empty(cap, dtype=np.int32)  # FIFO ring; a node is queued at most once
    touched = np.empty(n, dtype=np.int32)
    head = 0
    tail = 0
    nt = 0
    for t in range(seeds.size):
        v = seeds[t]
        res[v] += seedw[t]
        if flag[v] == 0:
            flag[v] = 1
            touched[nt] = v
            nt += 1
    for t in range(seeds.size):
        v = seeds[t]
        ov = outw[v]
        if flag[v] == 1 and res[v] > eps * (ov if ov > 0.0 else 1.0):
            flag[v] = 2
            q[tail] = v
            tail += 1
    pushes = 0
    while head != tail:
        u = q[head]
        head += 1
        if head == cap:
            head = 0
        flag[u] = 1
        ru = res[u]
        res[u] = 0.0
        pushes += 1
        out[u] += (1.0 - damping) * ru
        ow = outw[u]
        dangling = ow <= 0.0
        if dangling:  # the mass jumps back to the reset distribution
            lo = _U(0)
            hi = _U(seeds.size)
            scale = damping * ru
        else:
            lo = _U(indptr[u])
            hi = _U(indptr[u + 1])
            scale = damping * ru / ow
        for e in range(lo, hi):
            if dangling:
                v = _U(seeds[e])
                rv = res[v] + scale * seedw[e]
            else:
                v = _U(indices[e])
                rv = res[v] + scale * w[e]
            res[v] = rv
            f = flag[v]
            if f == 2:
                continue
            if f == 0:
                flag[v] = 1
                touched[nt] = v
                nt += 1
            ov = outw[v]
            if rv > eps * (ov if ov > 0.0 else 1.0):
                flag[v] = 2
                q[tail] = v
                tail += 1
                if tail == cap:
                    tail = 0
    # estimate p + (1 - damping) * residual, then refine the best _REFINE nodes with the next
    # step of the residual flowing into them: + damping * (1 - damping) * (P^T res)[v]
    heap_v = np.empty(_REFINE)
    heap_i = np.empty(_REFINE, dtype=np.int64)
    size = 0
    for t in range(nt):
        v = touched[t]
        x = out[v] + (1.0 - damping) * res[v]
        out[v] = x
        if size < _REFINE:
            _heap_push(heap_v, heap_i, size, x, v)
            size += 1
        elif x > heap_v[0]:
            _heap_replace(heap_v, heap_i, size, x, v)
    coef = damping * (1.0 - damping)
    for c in range(size):
        v = heap_i[c]
        acc = 0.0
        if in_outw.size:  # in-edges given by weight and the source's out-weight
            for e in range(_U(in_ptr[v]), _U(in_ptr[v + 1])):
                u = _U(in_idx[e])
                if in_outw[u] > 0.0:
                    acc += res[u] * in_val[e] / in_outw[u]
        else:  # in-edges given by transition probability
            for e in range(_U(in_ptr[v]), _U(in_ptr[v + 1])):
                acc += res[_U(in_idx[e])] * in_val[e]
        out[v] += coef * acc
    total = 0.0
    for t in range(nt):
        total += out[touched[t]]
    for t in range(nt):
        out[touched[t]] /= total
    return pushes


@njit(cache=True, nogil=True)
def _heap_push(hv, hi, size, x, v):
    """Insert ``(x, v)`` into the min-heap ``hv[:size]`` / ``hi[:size]``."""
    j = size
    while j > 0:
        parent = (j - 1) // 2
        if hv[parent] <= x:
            break
        hv[j] = hv[parent]
        hi[j] = hi[parent]
        j = parent
    hv[j] = x
    hi[j] = v


@njit(cache=True, nogil=True)
def _heap_replace(hv, hi, size, x, v):
    """Replace the minimum of the heap ``hv[:size]`` by ``(x, v)``."""
    j = 0
    while True:
        c = 2 * j + 1
        if c >= size:
            break
        if c + 1 < size and hv[c + 1] < hv[c]:
            c += 1
        if hv[c] >= x:
            break
        hv[j] = hv[c]
        hi[j] = hi[c]
        j = c
    hv[j] = x
    hi[j] = v


@njit(parallel=True, cache=True, nogil=True)
def _push_batch(
    indptr, indices, w, outw, in_ptr, in_idx, in_val, in_outw, seed_ptr, seeds, seedw, damping,
    eps, out,
):
    b = seed_ptr.size - 1
    pushes = np.zeros(b, dtype=np.int64)
    for k in prange(b):
        lo = seed_ptr[k]
        hi = seed_ptr[k + 1]
        pushes[k] = _push_row(
            indptr, indices, w, outw, in_ptr, in_idx, in_val, in_outw, seeds[lo:hi],
            seedw[lo:hi], damping, eps, out[k],
        )
    return pushes


def _push(g: PPRGraph, r2, sums, damping, eps):
    """Forward-push PPR for ``(b, n)`` resets with row sums ``sums``; returns
    ``(result, pushes)``."""
    b, n = r2.shape
    out = np.zeros((b, n))
    seed_ptr, seeds, seedw = _nonzeros(r2, sums)
    if g.symmetric:  # in-edges = out-edges
        into = (g.indptr, g.indices, g.weights, g.out_weight)
    else:
        into = (g.tindptr, g.tindices, g.tprob, np.zeros(0))
    graph = (g.indptr, g.indices, g.weights, g.out_weight, *into)
    if b == 1:
        pushes = _push_row(*graph, seeds, seedw, damping, eps, out[0])
        return out, np.array([pushes])
    with parallel_launch():
        pushes = _push_batch(*graph, seed_ptr, seeds, seedw, damping, eps, out)
    return out, pushes
