"""PPR called from many Python threads at once (a server answering queries from a thread pool).

numba's ``workqueue`` threading layer, which hipgraph selects, aborts the whole process when two
``parallel=True`` kernels run at once, so the workload runs in a fresh interpreter (this file run
as a script) and the test checks its exit status and its results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

THREADS = 8
ROUNDS = 12
TOL = 1e-12  # the parallel single-reset solver sums its dot products in thread order


def _graph_csrs():
    """A symmetric (undirected) and a directed CSR on the same random edges, with dangling nodes."""
    from hipgraph.query.ppr import to_csr

    rng = np.random.default_rng(7)
    n, m = 2000, 10000
    src = rng.integers(0, n - 50, m)  # the last 50 nodes have no out-edges in the directed graph
    dst = rng.integers(0, n, m)
    weight = rng.uniform(0.1, 2.0, m)
    return n, to_csr(n, src, dst, weight, undirected=True), to_csr(n, src, dst, weight,
                                                                    undirected=False)


def _resets(n, rows, rng):
    reset = np.zeros((rows, n))
    for k in range(rows):
        reset[k, rng.choice(n, 4, replace=False)] = rng.uniform(0.5, 1.5, 4)
    return reset


def _same_graph(g, h):
    """Every array prepare_graph computes is bit-identical in ``g`` and ``h``."""
    fields = ("out_weight", "sqrt_out", "dangling", "tindptr", "tindices", "tprob", "sym_weight")
    return g.symmetric == h.symmetric and all(
        np.array_equal(getattr(g, f), getattr(h, f)) for f in fields)


def _worker_main() -> None:
    """Run the concurrent workload and print a JSON summary; exits non-zero on any failure."""
    import numba

    from hipgraph.query.ppr import cg, ppr, prepare_graph

    n, sym_csr, dir_csr = _graph_csrs()
    rng = np.random.default_rng(11)
    big, small, one = _resets(n, 16, rng), _resets(n, 3, rng), _resets(n, 1, rng)[0]
    cg._PAR_EDGES = 0  # one symmetric reset takes the parallel solver (needs >= 2 numba threads)
    # (graph, reset, method): the parallel kernels _cg_batch, _cg_rows, _cg_1_par, _pull_b and
    # _push_batch (both graph kinds)
    tasks = [("sym", big, "power"), ("sym", small, "power"), ("sym", one, "power"),
             ("dir", big, "power"), ("sym", big, "push"), ("dir", big, "push")]
    barrier = threading.Barrier(THREADS)
    prepared = [None] * THREADS  # every thread's own prepare_graph of both CSRs
    first = [[None] * len(tasks) for _ in range(THREADS)]
    drift = np.zeros((THREADS, len(tasks)))  # max |result - the thread's first result|
    errors = []

    def work(t):
        try:
            barrier.wait()
            # the process's first parallel launches, all threads at once
            prepared[t] = {"sym": prepare_graph(*sym_csr), "dir": prepare_graph(*dir_csr)}
            barrier.wait()
            graphs = prepared[0]  # one prepared graph shared by every thread
            for r in range(ROUNDS):
                for step in range(len(tasks)):
                    i = (step + t + r) % len(tasks)  # threads run different kernels at once
                    kind, reset, method = tasks[i]
                    got = ppr(graphs[kind], reset, method=method)
                    if first[t][i] is None:
                        first[t][i] = got
                    else:
                        drift[t, i] = max(drift[t, i], float(np.abs(got - first[t][i]).max()))
                if r % 5 == 0:
                    kind = "sym" if t % 2 else "dir"
                    again = prepare_graph(*sym_csr if t % 2 else dir_csr)
                    if not _same_graph(again, prepared[t][kind]):
                        errors.append(f"thread {t}: prepare_graph differs in round {r}")
        except Exception as exc:  # reported below; the thread must not die silently
            errors.append(f"thread {t}: {exc!r}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()

    # serial references, computed after every thread has finished
    serial_graphs = {"sym": prepare_graph(*sym_csr), "dir": prepare_graph(*dir_csr)}
    mismatches = list(errors)
    for t in range(THREADS):
        if prepared[t] is None:
            continue
        for kind, g in prepared[t].items():
            if not _same_graph(g, serial_graphs[kind]):
                mismatches.append(f"thread {t}: prepared {kind} graph differs")
    for i, (kind, reset, method) in enumerate(tasks):
        ref = ppr(serial_graphs[kind], reset, method=method)
        for t in range(THREADS):
            got = first[t][i]
            if got is None:
                mismatches.append(f"thread {t}: task {i} never ran")
            elif got.shape != ref.shape or not np.abs(got - ref).max() <= TOL:
                mismatches.append(f"thread {t}: task {i} ({kind}, {method}) differs from serial")
            if not drift[t, i] <= TOL:
                mismatches.append(f"thread {t}: task {i} drifted by {drift[t, i]:.3g}")
    print(json.dumps({"layer": numba.threading_layer(), "numba_threads": numba.get_num_threads(),
                      "tasks_run": int(sum(x is not None for row in first for x in row)),
                      "mismatches": mismatches}))
    sys.exit(1 if mismatches else 0)


def test_concurrent_ppr_calls_do_not_abort_and_match_serial():
    repo = str(Path(__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}  # hipgraph's default
    env["NUMBA_NUM_THREADS"] = "2"  # parallel kernels need at least two numba threads
    env["PYTHONPATH"] = os.pathsep.join([repo, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve())], capture_output=True,
                          text=True, env=env, cwd=repo, timeout=600)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["layer"] == "workqueue"  # the layer that is not thread-safe was in use
    assert summary["numba_threads"] == 2
    assert summary["tasks_run"] == THREADS * 6 and summary["mismatches"] == []


if __name__ == "__main__":
    _worker_main()
