"""Personalized PageRank benchmark: hipgraph (exact, batched, push) vs igraph PRPACK and scipy.

Synthetic KG-like graph by default (power-law hubs, ~97k nodes, ~1.4M undirected edges);
``--db PATH`` reads the ``edges`` table of a hipgraph index's ``graph.duckdb`` instead.
Prints timings, ratios against igraph, the memory-bandwidth floor and agreement; it never
asserts targets.

    python benchmarks/ppr.py --nodes 20000 --edges 300000
    python benchmarks/ppr.py --db indexes/my-index
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from hipgraph.query import ppr
from hipgraph.query.ppr import personalized_pagerank, to_csr


def synthetic_graph(n: int, m: int, seed: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """Undirected KG-like graph: half the endpoints drawn from a Zipf-like hub distribution."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, n + 1) ** 0.9
    p /= p.sum()
    perm = rng.permutation(n)  # hubs spread over the id range
    hub = rng.random(m) < 0.5
    src = np.where(hub, perm[rng.choice(n, m, p=p)], rng.integers(0, n, m))
    dst = np.where(rng.random(m) < 0.3, perm[rng.choice(n, m, p=p)], rng.integers(0, n, m))
    keep = src != dst
    src, dst = src[keep], dst[keep]
    # fact edges weight 1, a share of "synonym" edges with cosine-like weights
    w = np.where(rng.random(src.size) < 0.2, rng.uniform(0.8, 1.0, src.size), 1.0)
    return n, src, dst, w


def db_graph(path: Path) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """Passages and entities of an index mapped to one dense id range (entities offset)."""
    import duckdb

    db = path if path.suffix == ".duckdb" else path / "graph.duckdb"
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("SELECT type, src, dst, weight FROM edges").fetchnumpy()
        max_pid = con.execute("SELECT max(id) FROM passages").fetchone()[0]
        max_eid = con.execute("SELECT max(id) FROM entities").fetchone()[0]
    finally:
        con.close()
    etype = np.asarray(rows["type"]).astype(str)
    src = np.asarray(rows["src"], dtype=np.int64)
    dst = np.asarray(rows["dst"], dtype=np.int64)
    w = np.asarray(rows["weight"], dtype=np.float64)
    mention = etype == "mention"
    if max_pid is None:
        max_pid = int(src[mention].max()) if mention.any() else -1
    offset = int(max_pid) + 1
    # fact / synonym: entity-entity; mention: passage -> entity
    src = np.where(mention, src, src + offset)
    dst = dst + offset
    n = offset + (int(max_eid) + 1 if max_eid is not None else int(dst.max()) - offset + 1)
    n = max(n, int(src.max()) + 1, int(dst.max()) + 1)
    types = {t: int((etype == t).sum()) for t in np.unique(etype)}
    print(f"index {db}: passages 0..{offset - 1}, entities offset {offset}, edge types {types}")
    return n, src, dst, w


def random_resets(rng, n: int, b: int, seeds: int, candidates: np.ndarray) -> np.ndarray:
    r = np.zeros((b, n))
    for k in range(b):
        idx = rng.choice(candidates, seeds, replace=False)
        r[k, idx] = rng.uniform(0.5, 1.5, seeds)
    return r / r.sum(axis=1, keepdims=True)


def copy_bandwidth_gbs() -> float:
    a = np.ones(32 * 1024 * 1024)  # 256 MiB
    b = np.empty_like(a)
    best = np.inf
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return 2 * a.nbytes / best / 1e9  # read + write


def topk(x: np.ndarray, k: int) -> set[int]:
    return set(np.argpartition(-x, k)[:k].tolist())


def timed(fn, reps: int) -> tuple[float, object]:
    out = fn()  # warm-up / compile
    t = time.perf_counter()
    for _ in range(reps):
        out = fn()
    return (time.perf_counter() - t) / reps, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=97_000)
    ap.add_argument("--edges", type=int, default=1_400_000, help="undirected edges")
    ap.add_argument("--db", type=Path, help="hipgraph index folder (or graph.duckdb) to read")
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=5, help="reset nodes per query")
    ap.add_argument("--damping", type=float, default=0.5)
    ap.add_argument("--tol", type=float, default=1e-8)
    ap.add_argument(
        "--eps", type=float, nargs="+", default=[1e-6, 1e-8], help="push residual thresholds"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    t0 = time.perf_counter()
    n, src, dst, w = db_graph(args.db) if args.db else synthetic_graph(args.nodes, args.edges, args.seed)
    indptr, indices, weights = to_csr(n, src, dst, w, undirected=True)
    deg = np.diff(indptr)
    m = indices.size
    print(
        f"graph: {n} nodes, {m} directed edges ({m // 2} undirected), max degree {deg.max()}, "
        f"isolated {(deg == 0).sum()}, built in {time.perf_counter() - t0:.1f}s"
    )
    rng = np.random.default_rng(args.seed + 1)
    nq = args.queries
    resets = random_resets(rng, n, max(nq, args.batch), args.seeds, np.flatnonzero(deg > 0))
    d, tol = args.damping, args.tol
    print(f"damping {d}, tol {tol}, {nq} queries x {args.seeds} seeds, batch {args.batch}")

    results: dict[str, tuple[float, np.ndarray | None]] = {}

    # igraph PRPACK
    import igraph

    srcs = np.repeat(np.arange(n), deg)
    g = igraph.Graph(n=n, edges=np.column_stack([srcs, indices]).tolist(), directed=True)
    g.es["weight"] = weights.tolist()
    ref = np.empty((nq, n))
    t = time.perf_counter()
    for q in range(nq):
        ref[q] = g.personalized_pagerank(
            directed=True, weights="weight", reset=resets[q].tolist(), damping=d
        )
    results["igraph PRPACK"] = ((time.perf_counter() - t) / nq, ref)

    # scipy sparse power iteration
    try:
        import scipy.sparse as sp
    except ImportError:
        sp = None
    if sp is not None:
        outw = np.bincount(srcs, weights=weights, minlength=n)
        inv = np.divide(1.0, outw, out=np.zeros(n), where=outw > 0)
        pt = sp.csr_matrix((weights * inv[srcs], indices, indptr), shape=(n, n)).T.tocsr()
        dangling = outw == 0

        def scipy_ppr(r):
            x = r.copy()
            for _ in range(100):
                y = d * (pt @ x) + (d * x[dangling].sum() + 1 - d) * r
                done = np.abs(y - x).sum() < tol
                x = y
                if done:
                    break
            return x / x.sum()

        out = np.empty((nq, n))
        scipy_ppr(resets[0])
        t = time.perf_counter()
        for q in range(nq):
            out[q] = scipy_ppr(resets[q])
        results["scipy power"] = ((time.perf_counter() - t) / nq, out)

    # hipgraph exact, one query at a time
    personalized_pagerank(indptr, indices, weights, resets[0], damping=d, tol=tol)  # compile
    out = np.empty((nq, n))
    t = time.perf_counter()
    for q in range(nq):
        out[q] = personalized_pagerank(indptr, indices, weights, resets[q], damping=d, tol=tol)
    results["hipgraph exact"] = ((time.perf_counter() - t) / nq, out)

    # hipgraph batched
    batch = resets[: args.batch]
    per_batch, out = timed(
        lambda: personalized_pagerank(indptr, indices, weights, batch, damping=d, tol=tol), 2
    )
    results[f"hipgraph batched b={args.batch}"] = (per_batch / batch.shape[0], out[:nq])

    # hipgraph push (residual sum <= eps * total weight, so eps must shrink with graph size)
    for eps in args.eps:
        personalized_pagerank(indptr, indices, weights, resets[0], damping=d, method="push", eps=eps)
        out = np.empty((nq, n))
        t = time.perf_counter()
        for q in range(nq):
            out[q] = personalized_pagerank(
                indptr, indices, weights, resets[q], damping=d, method="push", eps=eps
            )
        results[f"hipgraph push eps={eps:g}"] = ((time.perf_counter() - t) / nq, out)

    # memory-bandwidth floor for one query (b = 1) of the exact kernel
    w32 = weights.astype(np.float32)
    _, iters = ppr._power(indptr, indices, w32, resets[:1], d, tol, 100)
    bytes_iter = (n + 1) * 8 + m * (4 + 4) + n * 8 * 6  # tptr, tidx, tw, x/y/z/zn/r/inv_out
    gbs = copy_bandwidth_gbs()
    floor = bytes_iter * iters / (gbs * 1e9)
    _, iters_b = ppr._power(indptr, indices, w32, batch, d, tol, 100)
    bytes_iter_b = (n + 1) * 8 + m * 8 + n * 8 * (5 * batch.shape[0] + 1)
    floor_b = bytes_iter_b * iters_b / (gbs * 1e9) / batch.shape[0]

    base = results["igraph PRPACK"][0]
    print(f"\n{'method':<28}{'ms/query':>10}{'vs igraph':>11}{'mean L1':>11}{'top20':>8}{'same top10':>12}")
    for name, (sec, x) in results.items():
        if name == "igraph PRPACK":
            print(f"{name:<28}{sec * 1e3:>10.3f}{1.0:>10.2f}x{'-':>11}{'-':>8}{'-':>12}")
            continue
        l1 = np.abs(x - ref).sum(axis=1).mean()
        top20 = np.mean([len(topk(x[q], 20) & topk(ref[q], 20)) / 20 for q in range(nq)])
        same10 = np.mean([topk(x[q], 10) == topk(ref[q], 10) for q in range(nq)])
        speed = base / sec
        print(
            f"{name:<28}{sec * 1e3:>10.3f}{speed:>10.2f}x{l1:>11.2e}{top20:>8.3f}{same10:>12.2f}"
        )
    print(
        f"\nnumpy copy bandwidth {gbs:.1f} GB/s; exact b=1: {iters} iterations x "
        f"{bytes_iter / 1e6:.1f} MB -> floor {floor * 1e3:.3f} ms/query; "
        f"batched b={batch.shape[0]}: {iters_b} iterations x {bytes_iter_b / 1e6:.1f} MB -> "
        f"floor {floor_b * 1e3:.3f} ms/query"
    )
    print("(speed column = igraph time / method time; >1 means faster than igraph)")


if __name__ == "__main__":
    main()
