"""Numba runtime shared by the PPR kernels: threading layer, launch lock, index type.

hipgraph runs numba's parallel kernels on the ``workqueue`` threading layer (see
:func:`_choose_threading_layer`).  That layer is not thread-safe: two ``parallel=True`` kernels
running at once, launched from two Python threads (a web server answering queries from a
thread pool), make numba abort the whole process.  Every call of a parallel kernel therefore
runs inside :func:`parallel_launch`, which holds one process-wide lock unless numba reports a
thread-safe layer (``tbb`` or ``omp``, chosen with ``NUMBA_THREADING_LAYER``).  Until the first
parallel launch has started numba's layer, ``numba.threading_layer()`` cannot tell, so those
launches lock too; once it is known the decision is cached.  The lock serialises only the
parallel kernels, which use every numba thread anyway; serial kernels (one reset on a graph
under ``_PAR_EDGES`` edges, ``method="push"`` with one row) take no lock (they hold the GIL).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numba
import numpy as np

# Hot loops index with unsigned integers: numba then skips its negative-index wraparound
# code, which otherwise costs ~30% in the edge loops.  Never do arithmetic on these values
# (uint64 mixed with int64 gives float64 in numba).
_U = np.uint64

_THREAD_SAFE_LAYERS = frozenset({"tbb", "omp"})
_LAUNCH_LOCK = threading.RLock()  # re-entrant, so a nested use cannot deadlock
_launch_needs_lock: bool | None = None  # None until numba's threading layer is known


@contextmanager
def parallel_launch() -> Iterator[None]:
    """Run the body (one call of a ``parallel=True`` kernel) under the process-wide launch
    lock, unless numba's active threading layer is known to be thread-safe."""
    global _launch_needs_lock
    needs_lock = _launch_needs_lock
    if needs_lock is None:
        try:
            layer = numba.threading_layer()
        except ValueError:  # no parallel launch yet: the layer is unknown, so lock
            needs_lock = True
        else:
            needs_lock = _launch_needs_lock = layer not in _THREAD_SAFE_LAYERS
    if needs_lock:
        with _LAUNCH_LOCK:
            yield
    else:
        yield


_LAYER_CHOSEN = False


def _choose_threading_layer() -> None:
    """Use numba's ``workqueue`` threading layer unless the user chose one.

    With the default OpenMP layer, numba's workers and torch's OpenMP threads (the embedder)
    contend: a 64-question batch of graph queries took 10.3 s instead of 0.97 s on 2 cores. The
    choice is process-wide and must precede numba's first parallel call, so it is made here (on
    first use, not at import) and only when ``NUMBA_THREADING_LAYER`` is not set.
    """
    global _LAYER_CHOSEN
    if _LAYER_CHOSEN:
        return
    _LAYER_CHOSEN = True
    if os.environ.get("NUMBA_THREADING_LAYER"):
        return
    from numba.np.ufunc import parallel  # noqa: PLC0415

    if not getattr(parallel, "_is_initialized", False):
        numba.config.THREADING_LAYER = "workqueue"


def _edge_bounds(tptr, parts):
    """Node boundaries splitting the rows into ``parts`` ranges of about equal edge count."""
    n = tptr.size - 1
    m = int(tptr[-1])
    parts = max(1, min(parts, n))
    cuts = np.searchsorted(tptr, np.linspace(0, m, parts + 1)[1:-1], side="left")
    return np.unique(np.concatenate([[0], cuts, [n]])).astype(np.int64)
