"""Personalized PageRank kernels checked against igraph's PRPACK implementation."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

from hipgraph.query.ppr import PPRGraph, personalized_pagerank, ppr, prepare_graph, to_csr

try:
    import igraph
except ImportError as exc:  # a dev dependency (`make test` installs it): fail, never skip
    raise ImportError("python-igraph is missing: the PPR tests check against it; install the dev "
                      "dependencies (make test, or pip install -e '.[cpu,dev]')") from exc


def _igraph_ppr(indptr, indices, weights, reset, damping):
    n = indptr.size - 1
    src = np.repeat(np.arange(n), np.diff(indptr))
    g = igraph.Graph(n=n, edges=list(zip(src.tolist(), indices.tolist(), strict=True)), directed=True)
    rows = np.atleast_2d(reset)
    out = [
        g.personalized_pagerank(
            directed=True, weights=weights.tolist(), reset=r.tolist(), damping=damping
        )
        for r in rows
    ]
    return np.asarray(out).reshape(np.shape(reset))


def _dense_ppr(indptr, indices, weights, reset, damping):
    """PPR by a dense linear solve: ``(I - d P^T) x = (1 - d) r`` with ``P`` the row-normalised
    adjacency (dangling rows zero, their mass returns to the reset), then ``x / sum(x)``."""
    n = indptr.size - 1
    adjacency = np.zeros((n, n))
    for u in range(n):
        for k in range(indptr[u], indptr[u + 1]):
            adjacency[u, indices[k]] += weights[k]
    out_weight = adjacency.sum(axis=1, keepdims=True)
    transition = np.divide(adjacency, out_weight, out=np.zeros_like(adjacency), where=out_weight > 0)
    rows = np.atleast_2d(np.asarray(reset, dtype=np.float64))
    rows = rows / rows.sum(axis=1, keepdims=True)
    x = np.linalg.solve(np.eye(n) - damping * transition.T, (1 - damping) * rows.T).T
    return (x / x.sum(axis=1, keepdims=True)).reshape(np.shape(reset))


def _random_graph(rng, n, m, *, undirected, weighted, isolated=0):
    """Random graph on ``n`` nodes; the last ``isolated`` nodes have no edges, and a small
    separate component lives on a few nodes before them."""
    core = n - isolated - 5
    src = rng.integers(0, core, m)
    dst = rng.integers(0, core, m)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    # a disconnected 5-node path component
    comp = np.arange(core, core + 5)
    src = np.concatenate([src, comp[:-1]])
    dst = np.concatenate([dst, comp[1:]])
    w = rng.uniform(0.1, 3.0, src.size) if weighted else None
    return to_csr(n, src, dst, w, undirected=undirected)


def _resets(rng, n, b, seeds=3):
    r = np.zeros((b, n))
    for k in range(b):
        idx = rng.choice(n, seeds, replace=False)
        r[k, idx] = rng.uniform(0.5, 2.0, seeds)
    return r


GRAPHS = [
    dict(n=60, m=150, undirected=True, weighted=False, isolated=2),
    dict(n=80, m=250, undirected=False, weighted=True, isolated=3),
    dict(n=200, m=500, undirected=True, weighted=True, isolated=4),
    dict(n=150, m=300, undirected=False, weighted=False, isolated=0),
]


@pytest.mark.parametrize("damping", [0.5, 0.85])
@pytest.mark.parametrize("spec", GRAPHS, ids=lambda s: f"n{s['n']}-u{int(s['undirected'])}")
def test_power_matches_igraph(spec, damping):
    rng = np.random.default_rng(spec["n"] + int(damping * 100))
    indptr, indices, weights = _random_graph(rng, **spec)
    n = spec["n"]
    if not spec["undirected"]:
        assert np.any(np.diff(indptr) == 0), "directed test graph should have dangling nodes"
    for reset in (_resets(rng, n, 1)[0], rng.random(n)):
        got = personalized_pagerank(indptr, indices, weights, reset, damping=damping)
        ref = _igraph_ppr(indptr, indices, weights, reset, damping)
        assert got.shape == reset.shape and got.dtype == np.float64
        assert np.abs(got - ref).sum() <= 1e-6
        assert abs(got.sum() - 1.0) < 1e-9


@pytest.mark.parametrize("damping", [0.5, 0.85])
def test_batched_matches_per_row_igraph(damping):
    rng = np.random.default_rng(7)
    indptr, indices, weights = _random_graph(
        rng, 120, 400, undirected=False, weighted=True, isolated=2
    )
    reset = _resets(rng, 120, 9)
    reset[3] = rng.random(120)  # a dense row among sparse ones
    reset[5, 117] = 1.0  # a seed on an isolated (dangling) node
    got = personalized_pagerank(indptr, indices, weights, reset, damping=damping)
    ref = _igraph_ppr(indptr, indices, weights, reset, damping)
    assert got.shape == reset.shape
    l1 = np.abs(got - ref).sum(axis=1)
    assert np.all(l1 <= 1e-6), l1
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-9)
    # the batch equals the single-row runs too (up to the convergence tolerance: the batch
    # iterates until its slowest row has converged)
    for k in (0, 3, 5):
        single = personalized_pagerank(indptr, indices, weights, reset[k], damping=damping)
        assert np.abs(single - got[k]).sum() <= 1e-7


def test_no_edges_returns_reset():
    indptr = np.zeros(5, dtype=np.int64)
    reset = np.array([0.0, 2.0, 0.0, 6.0])
    got = personalized_pagerank(indptr, np.zeros(0, np.int32), np.zeros(0), reset, damping=0.85)
    np.testing.assert_allclose(got, [0.0, 0.25, 0.0, 0.75])
    # push recycles dangling mass to the seeds until residuals drop below eps
    got = personalized_pagerank(
        indptr, np.zeros(0, np.int32), np.zeros(0), reset, method="push", eps=1e-9
    )
    np.testing.assert_allclose(got, [0.0, 0.25, 0.0, 0.75], atol=1e-8)


def test_hand_computed_chain():
    # 0 -> 1 -> 2, node 2 dangling; reset on 0, damping 0.5:
    # x0 = 0.5 + 0.5 * x2, x1 = 0.5 * x0, x2 = 0.5 * x1  ->  x0 = 4/7, x1 = 2/7, x2 = 1/7
    indptr, indices, weights = to_csr(3, [0, 1], [1, 2], undirected=False)
    got = personalized_pagerank(indptr, indices, weights, np.array([1.0, 0, 0]))
    np.testing.assert_allclose(got, np.array([4, 2, 1]) / 7, atol=1e-9)


def test_to_csr_sums_duplicates_and_symmetrises():
    indptr, indices, weights = to_csr(4, [0, 0, 1, 2], [1, 1, 2, 2], [1.0, 2.0, 0.5, 4.0])
    np.testing.assert_array_equal(indptr, [0, 1, 3, 5, 5])
    np.testing.assert_array_equal(indices, [1, 0, 2, 1, 2])
    np.testing.assert_allclose(weights, [3.0, 3.0, 0.5, 0.5, 4.0])
    indptr, indices, weights = to_csr(3, [0, 0], [1, 1], undirected=False)
    np.testing.assert_array_equal(indptr, [0, 1, 1, 1])
    np.testing.assert_allclose(weights, [2.0])


@pytest.mark.parametrize("undirected", [True, False])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint16])
def test_to_csr_matches_scipy(undirected, dtype):
    """Against scipy's COO -> CSR (duplicates summed, columns sorted), with hub rows long enough
    for the kernel's mergesort branch and short rows for its insertion sort; weights are
    multiples of 1/8, so every sum is exact in any order."""
    from scipy import sparse

    rng = np.random.default_rng(5)
    for n, m, e in ((1, 1, 0), (1, 1, 3), (40, 40, 300), (500, 700, 20_000)):
        m = n if undirected else m
        src, dst = rng.integers(0, n, e), rng.integers(0, m, e)
        src[: e // 3] = n // 2  # a hub row (and, undirected, a hub column)
        if n > 1 and e:
            dst[: e // 5] = src[: e // 5]  # self-loops, added once
        w = rng.integers(0, 64, e) / 8
        indptr, indices, weights = to_csr(n, src.astype(dtype), dst.astype(dtype), w,
                                          undirected=undirected, n_cols=None if undirected else m)
        if undirected:
            off = src != dst
            src, dst, w = np.r_[src, dst[off]], np.r_[dst, src[off]], np.r_[w, w[off]]
        want = sparse.coo_array((w, (src, dst)), shape=(n, m)).tocsr()
        want.sum_duplicates()  # also sorts the columns; explicit zeros stay, as in to_csr
        assert indptr.dtype == np.int64 and indices.dtype == np.int32 and weights.dtype == np.float64
        np.testing.assert_array_equal(indptr, want.indptr)
        np.testing.assert_array_equal(indices, want.indices)
        np.testing.assert_array_equal(weights, want.data)


@pytest.mark.parametrize("damping", [0.5, 0.85])
def test_push_top10_agrees_with_exact(damping):
    rng = np.random.default_rng(11)
    n = 3000
    # power-law-ish hubs plus uniform edges
    p = 1.0 / np.arange(1, n + 1) ** 0.8
    p /= p.sum()
    src = np.concatenate([rng.choice(n, 6000, p=p), rng.integers(0, n, 6000)])
    dst = rng.integers(0, n, src.size)
    keep = src != dst
    indptr, indices, weights = to_csr(n, src[keep], dst[keep], rng.uniform(0.5, 1.5, keep.sum()))
    reset = _resets(rng, n, 6, seeds=4)
    exact = personalized_pagerank(indptr, indices, weights, reset, damping=damping)
    ref = _igraph_ppr(indptr, indices, weights, reset[0], damping)
    assert np.abs(exact[0] - ref).sum() <= 1e-6
    push = personalized_pagerank(
        indptr, indices, weights, reset, damping=damping, method="push", eps=1e-6
    )
    np.testing.assert_allclose(push.sum(axis=1), 1.0, atol=1e-9)
    assert np.all(push >= 0)
    for k in range(reset.shape[0]):
        top_exact = set(np.argsort(-exact[k])[:10].tolist())
        top_push = set(np.argsort(-push[k])[:10].tolist())
        assert len(top_exact & top_push) >= 9
        assert np.abs(push[k] - exact[k]).sum() < 0.05


def test_push_is_local_and_handles_dangling():
    # a long directed path 0 -> 1 -> ... with a coarse eps only touches the start
    n = 10_000
    indptr, indices, weights = to_csr(n, np.arange(n - 1), np.arange(1, n), undirected=False)
    reset = np.zeros(n)
    reset[0] = 1.0
    got = personalized_pagerank(indptr, indices, weights, reset, method="push", eps=1e-4)
    assert np.count_nonzero(got) < 30
    assert abs(got.sum() - 1.0) < 1e-12
    # a dangling seed neighbour: push and exact (igraph) agree closely with a fine eps
    indptr, indices, weights = to_csr(4, [0, 0, 1], [1, 2, 3], undirected=False)
    reset = np.array([1.0, 0.0, 0.0, 0.0])
    push = personalized_pagerank(indptr, indices, weights, reset, method="push", eps=1e-12)
    ref = _igraph_ppr(indptr, indices, weights, reset, 0.5)
    assert np.abs(push - ref).sum() < 1e-8
    # two unequal seeds: a dangling node's mass returns in the reset's proportions (dropping it
    # would be the same after normalisation; sending it elsewhere is not)
    reset = np.array([0.7, 0.0, 0.0, 0.3])
    push = personalized_pagerank(indptr, indices, weights, reset, method="push", eps=1e-12)
    assert np.abs(push - _dense_ppr(indptr, indices, weights, reset, 0.5)).sum() < 1e-8


def test_validation_errors():
    indptr, indices, weights = to_csr(3, [0, 1], [1, 2])
    good = np.array([1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="row 1"):
        personalized_pagerank(indptr, indices, weights, np.array([[1.0, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="reset must be non-negative"):
        personalized_pagerank(indptr, indices, weights, np.array([1.0, -0.5, 0]))
    with pytest.raises(ValueError, match="weights must be non-negative"):
        personalized_pagerank(indptr, indices, -weights, good)
    with pytest.raises(ValueError, match="columns"):
        personalized_pagerank(indptr, indices, weights, np.ones(4))
    with pytest.raises(ValueError, match="shape"):
        personalized_pagerank(indptr, indices, weights, np.ones((1, 1, 3)))
    with pytest.raises(ValueError, match="weights has"):
        personalized_pagerank(indptr, indices, weights[:-1], good)
    with pytest.raises(ValueError, match="indices must lie"):
        personalized_pagerank(indptr, indices + 5, weights, good)
    with pytest.raises(ValueError, match="indptr"):
        personalized_pagerank(indptr[::-1].copy(), indices, weights, good)
    with pytest.raises(ValueError, match="damping"):
        personalized_pagerank(indptr, indices, weights, good, damping=1.0)
    with pytest.raises(ValueError, match="method"):
        personalized_pagerank(indptr, indices, weights, good, method="magic")
    with pytest.raises(ValueError, match="eps"):
        personalized_pagerank(indptr, indices, weights, good, method="push", eps=0)
    with pytest.raises(ValueError, match="non-negative"):
        to_csr(3, [0], [1], [-1.0])
    with pytest.raises(ValueError, match="node ids"):
        to_csr(3, [0], [3])
    # rectangular (entity -> passage): columns checked against n_cols, not n
    indptr2, indices2, _ = to_csr(2, [0, 1, 1], [4, 0, 4], undirected=False, n_cols=5)
    assert indptr2.tolist() == [0, 1, 3] and indices2.tolist() == [4, 0, 4]
    with pytest.raises(ValueError, match="column node ids"):
        to_csr(2, [0], [5], undirected=False, n_cols=5)
    with pytest.raises(ValueError, match="n_cols"):
        to_csr(2, [0], [1], n_cols=5)
    # dtype conversion: lists and int weights are accepted
    got = personalized_pagerank(
        indptr.tolist(), indices.tolist(), [1] * len(indices), [1, 0, 0]
    )
    assert got.dtype == np.float64 and abs(got.sum() - 1) < 1e-12


# --------------------------------------------------------------------------------------------
# Prepared graphs
# --------------------------------------------------------------------------------------------


def test_hand_computed_chain_matches_the_dense_reference():
    indptr, indices, weights = to_csr(3, [0, 1], [1, 2], undirected=False)
    np.testing.assert_allclose(_dense_ppr(indptr, indices, weights, np.array([1.0, 0, 0]), 0.5),
                               np.array([4, 2, 1]) / 7, atol=1e-12)


def test_prepared_graph_matches_one_shot_and_a_dense_solve():
    rng = np.random.default_rng(5)
    for spec in GRAPHS:
        indptr, indices, weights = _random_graph(rng, **spec)
        n = spec["n"]
        g = prepare_graph(indptr, indices, weights)
        assert g.n == n and g.m == indices.size
        assert g.symmetric == spec["undirected"]
        reset = _resets(rng, n, 5)
        for damping in (0.5, 0.85):
            ref = _dense_ppr(indptr, indices, weights, reset, damping)
            for r, want in ((reset[0], ref[0]), (reset, ref)):
                exact = ppr(g, r, damping=damping)
                assert exact.shape == r.shape
                assert np.all(np.abs(exact - want).sum(axis=-1) <= 1e-6)
                fine = ppr(g, r, damping=damping, method="push", eps=1e-10)
                assert np.all(np.abs(fine - want).sum(axis=-1) <= 1e-6)
        for method in ("power", "push"):  # the one-shot form is the prepared one, defaults included
            for r in (reset[0], reset):
                want = personalized_pagerank(indptr, indices, weights, r, method=method)
                np.testing.assert_array_equal(ppr(g, r, method=method), want)


def test_symmetric_flag():
    rng = np.random.default_rng(9)
    indptr, indices, weights = _random_graph(rng, 200, 600, undirected=True, weighted=True)
    detected = prepare_graph(indptr, indices, weights)
    given = prepare_graph(indptr, indices, weights, symmetric=True)
    built = prepare_graph(indptr, indices, weights, symmetric=False)
    assert detected.symmetric and given.symmetric and not built.symmetric
    assert given.tindptr is given.indptr and given.tindices is given.indices
    np.testing.assert_array_equal(built.tindices, given.tindices)
    reset = _resets(rng, 200, 4)
    ref = _igraph_ppr(indptr, indices, weights, reset, 0.5)
    for g in (detected, given, built):
        got = ppr(g, reset)
        assert np.all(np.abs(got - ref).sum(axis=1) <= 1e-6)
    # symmetric graphs are solved by conjugate gradients, others by power iteration
    assert np.all(np.abs(ppr(built, reset) - ppr(given, reset)).sum(axis=1) <= 1e-7)
    np.testing.assert_array_equal(ppr(detected, reset), ppr(given, reset))
    # a directed graph is detected as such; symmetric=True on it is rejected when the
    # in-degrees differ from the out-degrees
    indptr, indices, weights = to_csr(3, [0, 0], [1, 2], undirected=False)
    assert not prepare_graph(indptr, indices, weights).symmetric
    with pytest.raises(ValueError, match="symmetric"):
        prepare_graph(indptr, indices, weights, symmetric=True)
    with pytest.raises(TypeError, match="PPRGraph"):
        ppr((indptr, indices, weights), np.ones(3))


@pytest.mark.parametrize("undirected", [True, False])
def test_read_only_and_memmapped_arrays(tmp_path, undirected):
    rng = np.random.default_rng(13)
    indptr, indices, weights = _random_graph(
        rng, 150, 500, undirected=undirected, weighted=True, isolated=2
    )
    reset = _resets(rng, 150, 3)
    want = {m: personalized_pagerank(indptr, indices, weights, reset, method=m)
            for m in ("power", "push")}
    want1 = personalized_pagerank(indptr, indices, weights, reset[0])
    # read-only in-memory arrays (float32 weights: the kernels' dtype, so nothing is copied)
    arrays = [indptr.copy(), indices.copy(), weights.astype(np.float32)]
    for a in arrays:
        a.flags.writeable = False
    g = prepare_graph(*arrays)
    assert g.indices is arrays[1] and g.weights is arrays[2]  # no copies
    reset_ro = reset.copy()
    reset_ro.flags.writeable = False
    for m in ("power", "push"):
        np.testing.assert_allclose(ppr(g, reset_ro, method=m), want[m], atol=1e-12)
    np.testing.assert_allclose(ppr(g, reset_ro[0]), want1, atol=1e-12)
    # memory-mapped arrays, also for every array of the prepared graph
    for name, a in zip(("indptr", "indices", "weights"), arrays, strict=True):
        np.save(tmp_path / f"{name}.npy", a)
    mm = [np.load(tmp_path / f"{k}.npy", mmap_mode="r") for k in ("indptr", "indices", "weights")]
    g = prepare_graph(*mm, symmetric=undirected)
    for m in ("power", "push"):
        np.testing.assert_allclose(ppr(g, reset, method=m), want[m], atol=1e-12)
    fields = {}
    for k, v in vars(g).items():
        if isinstance(v, np.ndarray):
            np.save(tmp_path / f"g_{k}.npy", v)
            fields[k] = np.load(tmp_path / f"g_{k}.npy", mmap_mode="r")
        else:
            fields[k] = v
    g_mm = PPRGraph(**fields)
    assert isinstance(g_mm.tprob, np.memmap) and not g_mm.tprob.flags.writeable
    for m in ("power", "push"):
        np.testing.assert_allclose(ppr(g_mm, reset, method=m), want[m], atol=1e-12)
    np.testing.assert_array_equal(ppr(g_mm, reset[1]), ppr(g, reset[1]))


@pytest.mark.parametrize("damping", [0.5, 0.85])
def test_symmetric_batch_blocks_match_igraph(damping):
    # 19 rows: two full conjugate-gradient blocks of 8 and a partial one; rows that converge
    # at once (all mass on an isolated node) or slowly (dense) share blocks with sparse rows
    rng = np.random.default_rng(17)
    n = 300
    indptr, indices, weights = _random_graph(rng, n, 900, undirected=True, weighted=True,
                                             isolated=3)
    g = prepare_graph(indptr, indices, weights)
    assert g.symmetric and {297, 298, 299} <= set(g.dangling.tolist())
    reset = _resets(rng, n, 19)
    reset[2] = 0.0
    reset[2, n - 1] = 1.0  # only an isolated node: the answer is the reset itself
    reset[9] = rng.random(n)
    reset[17, n - 2] = 5.0  # most mass on an isolated node
    got = ppr(g, reset, damping=damping)
    ref = _igraph_ppr(indptr, indices, weights, reset, damping)
    l1 = np.abs(got - ref).sum(axis=1)
    assert np.all(l1 <= 1e-6), l1
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(got[2], reset[2])
    for k in (0, 2, 9, 17, 18):
        single = ppr(g, reset[k], damping=damping)
        assert np.abs(single - got[k]).sum() <= 1e-8
    # small batches are solved row by row
    np.testing.assert_array_equal(ppr(g, reset[[0, 2, 9]], damping=damping)[1], reset[2])
    np.testing.assert_array_equal(ppr(g, reset[[9, 0]], damping=damping)[1],
                                  ppr(g, reset[0], damping=damping))
    # max_iter caps the work (and still returns a normalised non-negative-sum estimate)
    capped = ppr(g, reset, damping=damping, max_iter=1)
    np.testing.assert_allclose(capped.sum(axis=1), 1.0, atol=1e-12)


@pytest.mark.parametrize("undirected", [True, False])
def test_zero_weight_edges(undirected):
    # node 3 only has zero-weight edges: it is dangling although it has CSR entries
    src = [0, 1, 2, 3, 3, 4]
    dst = [1, 2, 0, 4, 0, 0]
    w = [1.0, 2.0, 1.0, 0.0, 0.0, 1.5]
    indptr, indices, weights = to_csr(5, src, dst, w, undirected=undirected)
    g = prepare_graph(indptr, indices, weights)
    assert 3 in g.dangling.tolist()
    reset = np.array([[1.0, 0, 0, 1.0, 0], [0, 0, 0, 0, 1.0]])
    ref = _igraph_ppr(indptr, indices, weights, reset, 0.5)
    got = ppr(g, reset)
    assert np.all(np.abs(got - ref).sum(axis=1) <= 1e-6)
    push = ppr(g, reset, method="push", eps=1e-12)
    assert np.all(np.isfinite(push))
    assert np.all(np.abs(push - ref).sum(axis=1) <= 1e-6)


def test_parallel_single_reset_solver_matches(monkeypatch):
    # large graphs solve one symmetric reset with every sweep split over the threads; the path
    # needs two numba threads, so a process started with one re-runs this test with two
    if numba.config.NUMBA_NUM_THREADS < 2:
        env = dict(os.environ, NUMBA_NUM_THREADS="2")
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               f"{Path(__file__).resolve()}::test_parallel_single_reset_solver_matches"],
                              capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0 and re.search(r"\b1 passed", proc.stdout), proc.stdout + proc.stderr
        return
    from hipgraph.query.ppr import cg as cg_module

    rng = np.random.default_rng(23)
    indptr, indices, weights = _random_graph(rng, 400, 1500, undirected=True, weighted=True,
                                             isolated=2)
    g = prepare_graph(indptr, indices, weights)
    reset = _resets(rng, 400, 2)
    serial = [ppr(g, r) for r in reset]
    parallel_calls = []
    solver = cg_module._cg_1_par

    def counted(*args):
        parallel_calls.append(args[5].size - 1)  # the row ranges the sweeps are split into
        return solver(*args)

    monkeypatch.setattr(cg_module, "_cg_1_par", counted)
    monkeypatch.setattr(cg_module, "_PAR_EDGES", 0)
    threads = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        got = [ppr(g, r) for r in reset]
    finally:
        numba.set_num_threads(threads)
    assert len(parallel_calls) == 2 and all(parts > 1 for parts in parallel_calls), parallel_calls
    ref = _igraph_ppr(indptr, indices, weights, reset, 0.5)
    for k in range(len(reset)):
        assert np.abs(got[k] - serial[k]).sum() <= 1e-12
        assert np.abs(got[k] - ref[k]).sum() <= 1e-6
