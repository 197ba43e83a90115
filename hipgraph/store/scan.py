"""Entries of a score matrix at or above a limit: the scan after a range search's products."""

from __future__ import annotations

import numpy as np
from numba import njit

_CHUNK = 64  # entries counted before any is read one by one (most chunks hold none)


@njit(cache=True, nogil=True)
def pairs_at_least(scores: np.ndarray, limit: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, cols)`` of the entries of ``scores`` (2-d float32) that are >= ``limit``, in
    row-major order: what ``np.nonzero(scores >= limit)`` gives for a float32 ``limit``, in one
    pass without a boolean matrix, and without the GIL."""
    m, n = scores.shape
    cap = 1024
    rows = np.empty(cap, np.int64)
    cols = np.empty(cap, np.int64)
    k = 0
    for i in range(m):
        row = scores[i]
        for start in range(0, n, _CHUNK):
            stop = min(start + _CHUNK, n)
            hits = 0
            for j in range(start, stop):  # vectorised: a count, no branch
                hits += row[j] >= limit
            if hits == 0:
                continue
            for j in range(start, stop):
                if row[j] >= limit:
                    if k == cap:
                        cap *= 2
                        grown_rows = np.empty(cap, np.int64)
                        grown_cols = np.empty(cap, np.int64)
                        grown_rows[:k] = rows[:k]
                        grown_cols[:k] = cols[:k]
                        rows, cols = grown_rows, grown_cols
                    rows[k] = i
                    cols[k] = j
                    k += 1
    return rows[:k], cols[:k]
