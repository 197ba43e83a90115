"""Personalized PageRank benchmark: hipgraph (exact, batched, push) vs igraph PRPACK and scipy.

Synthetic KG-like graph of MuSiQue-index size by default (~97k nodes of which 12% passages,
~1.4M undirected edges, power-law entity hubs); ``--db PATH`` reads a hipgraph index's
``graph.duckdb`` instead (passages -> nodes 0..P-1, entities -> P..P+E-1, all edges
undirected).  Two reset shapes are timed, as graph retrieval builds them:

* ``sparse``: a handful of entity seeds (weights U(0.1, 1), like fact score / passage count);
* ``dense``: the same seeds plus the best ``--passages`` passages by a simulated dense score,
  each weighted ``0.05 x`` its min-max normalised score.

For every method it prints ms/query, speed-up over igraph, L1 distance to igraph, top-20
overlap and the share of queries whose top-10 node set (and top-10 passage set) equals
igraph's, plus the memory-bandwidth floor of the exact kernel.  It never asserts targets.

    python benchmarks/ppr.py                        # synthetic, MuSiQue size
    python benchmarks/ppr.py --db /tmp/idx/musique  # a real index
    python benchmarks/ppr.py --nodes 20000 --edges 300000 --json out.json
    python benchmarks/ppr.py --nodes 20000 --edges 300000 --threads 1 2 4 8  # concurrent calls

``--threads`` only measures the throughput of ``ppr()`` called from that many Python threads
at once on one prepared graph (parallel kernels take a process-wide launch lock under numba's
``workqueue`` layer, serial kernels hold the GIL) and skips the comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import numba
import numpy as np

from hipgraph.query.ppr import ppr, prepare_graph, to_csr

# --------------------------------------------------------------------------------------------
# graphs
# --------------------------------------------------------------------------------------------


def synthetic_graph(n: int, m: int, seed: int, passage_share: float = 0.12):
    """KG-like undirected graph: passages mention ~15 entities each (Zipf-like popularity);
    the remaining edges link entities, half of the endpoints drawn from a power-law hub
    distribution; fact edges weigh 1 (or a small count), synonym edges 0.8..1.

    Returns ``(n, n_passages, src, dst, weight)`` with passages on nodes ``0..P-1``.
    """
    rng = np.random.default_rng(seed)
    n_p = int(round(n * passage_share))
    n_e = n - n_p
    pop = 1.0 / np.arange(1, n_e + 1) ** 0.9
    pop /= pop.sum()
    perm = rng.permutation(n_e)  # hubs spread over the id range

    def hub(size):
        return perm[rng.choice(n_e, size, p=pop)]

    k = rng.poisson(15, n_p)
    m_mention = min(int(k.sum()), m // 2)
    p_src = np.repeat(np.arange(n_p), k)[:m_mention]
    p_dst = n_p + np.where(rng.random(m_mention) < 0.5, hub(m_mention), rng.integers(0, n_e, m_mention))
    m_ent = m - m_mention
    a = np.where(rng.random(m_ent) < 0.5, hub(m_ent), rng.integers(0, n_e, m_ent))
    b = np.where(rng.random(m_ent) < 0.3, hub(m_ent), rng.integers(0, n_e, m_ent))
    keep = a != b
    a, b = n_p + a[keep], n_p + b[keep]
    synonym = rng.random(a.size) < 0.3
    w_ent = np.where(synonym, rng.uniform(0.8, 1.0, a.size), rng.choice([1.0, 1.0, 1.0, 2.0], a.size))
    src = np.concatenate([p_src, a])
    dst = np.concatenate([p_dst, b])
    w = np.concatenate([np.ones(m_mention), w_ent])
    return n, n_p, src, dst, w


def db_graph(path: Path):
    """Passages -> nodes 0..P-1 and entities -> P..P+E-1 (ids sorted), edges of ``edges``."""
    import duckdb

    db = path if path.suffix == ".duckdb" else path / "graph.duckdb"
    con = duckdb.connect(str(db), read_only=True)
    try:
        pids = np.asarray(con.execute("SELECT id FROM passages ORDER BY id").fetchnumpy()["id"])
        eids = np.asarray(con.execute("SELECT id FROM entities ORDER BY id").fetchnumpy()["id"])
        rows = con.execute("SELECT type, src, dst, weight FROM edges").fetchnumpy()
    finally:
        con.close()
    pids = pids.astype(np.int64)
    eids = eids.astype(np.int64)
    etype = np.asarray(rows["type"]).astype(str)
    src = np.asarray(rows["src"], dtype=np.int64)
    dst = np.asarray(rows["dst"], dtype=np.int64)
    w = np.asarray(rows["weight"], dtype=np.float64)

    def lookup(ids, x):
        """Position of every ``x`` in the sorted ``ids``, -1 where absent."""
        if ids.size == 0:
            return np.full(x.shape, -1, dtype=np.int64)
        pos = np.searchsorted(ids, x).clip(0, ids.size - 1)
        return np.where(ids[pos] == x, pos, -1)

    mention = etype == "mention"
    s_local = np.where(mention, lookup(pids, src), lookup(eids, src))
    d_local = lookup(eids, dst)
    ok = (s_local >= 0) & (d_local >= 0)
    s = np.where(mention, s_local, pids.size + s_local)
    d = pids.size + d_local
    types = {str(t): int((etype == t).sum()) for t in np.unique(etype)}
    print(f"index {db}: {pids.size} passages, {eids.size} entities, edges {types}, "
          f"{int((~ok).sum())} edge rows with unknown endpoints dropped")
    return pids.size + eids.size, pids.size, s[ok], d[ok], w[ok]


# --------------------------------------------------------------------------------------------
# queries
# --------------------------------------------------------------------------------------------


def make_resets(rng, n, n_p, b, seeds, passages, deg):
    """``(b, n)`` sparse (entity seeds) and dense (seeds + top passages) unnormalised resets."""
    ents = np.arange(n_p, n)
    ents = ents[deg[ents] > 0]
    sparse = np.zeros((b, n))
    dense = np.zeros((b, n))
    k_p = min(passages, n_p)
    for q in range(b):
        k = int(rng.integers(max(1, seeds // 2), seeds + 1))
        idx = rng.choice(ents, k, replace=False)
        sparse[q, idx] = rng.uniform(0.1, 1.0, k)
        dense[q] = sparse[q]
        if k_p:
            score = rng.normal(size=n_p)
            top = np.argpartition(-score, k_p - 1)[:k_p]
            s = score[top]
            span = s.max() - s.min()
            dense[q, top] += 0.05 * ((s - s.min()) / span if span > 0 else 1.0)
    return {"sparse": sparse, "dense": dense}


# --------------------------------------------------------------------------------------------
# measurement helpers
# --------------------------------------------------------------------------------------------


_FAST = {"contract", "reassoc", "nsz", "arcp"}


@numba.njit(cache=True, fastmath=_FAST)
def _stream_sum(a):
    s = np.float32(0.0)
    for i in range(a.size):
        s += a[i]
    return s


@numba.njit(parallel=True, cache=True)
def _stream_sum_par(a, parts):
    chunk = (a.size + parts - 1) // parts
    tot = 0.0
    for c in numba.prange(parts):
        tot += _stream_sum(a[c * chunk : min(a.size, (c + 1) * chunk)])
    return tot


def read_bandwidth_gbs(mib: int = 512) -> tuple[float, float]:
    """Best-of-5 read bandwidth over a ``mib`` MiB array: one thread, all numba threads."""
    a = np.ones(mib * 1024 * 1024 // 4, dtype=np.float32)
    parts = 4 * numba.get_num_threads()
    out = []
    for fn in (lambda: _stream_sum(a), lambda: _stream_sum_par(a, parts)):
        fn()
        best = np.inf
        for _ in range(5):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        out.append(a.nbytes / best / 1e9)
    return out[0], out[1]


def topk(x: np.ndarray, k: int) -> set[int]:
    k = min(k, x.size)
    return set(np.argpartition(-x, k - 1)[:k].tolist())


def agreement(x: np.ndarray, ref: np.ndarray, n_p: int) -> dict:
    nq = ref.shape[0]
    l1 = np.abs(x - ref).sum(axis=1)
    out = {
        "l1_mean": float(l1.mean()),
        "l1_max": float(l1.max()),
        "top20_overlap": float(np.mean([len(topk(x[q], 20) & topk(ref[q], 20)) / 20
                                        for q in range(nq)])),
        "same_top10": float(np.mean([topk(x[q], 10) == topk(ref[q], 10) for q in range(nq)])),
    }
    if n_p >= 10:
        out["same_top10_passages"] = float(np.mean(
            [topk(x[q, :n_p], 10) == topk(ref[q, :n_p], 10) for q in range(nq)]))
    return out


def per_query(fn, resets, reps: int = 1):
    """Mean seconds per query of ``fn(reset_row)`` over the rows (after one warm-up)."""
    fn(resets[0])
    out = np.empty_like(resets)
    best = np.inf
    for _ in range(reps):
        t = time.perf_counter()
        for q in range(resets.shape[0]):
            out[q] = fn(resets[q])
        best = min(best, (time.perf_counter() - t) / resets.shape[0])
    return best, out


def _call_each(call, ks) -> None:
    for k in ks:
        call(k)


def thread_throughput(g, resets, thread_counts, batch: int, damping: float, eps: float,
                      calls: int = 48) -> dict:
    """Calls per second of ``ppr()`` issued from ``N`` Python threads at once (``calls`` calls
    per case and thread count, split over the threads), for each of ``thread_counts``."""
    cases = {
        "exact b=1": lambda k: ppr(g, resets[k % len(resets)], damping=damping),
        f"exact b={batch}": lambda k: ppr(g, resets[:batch], damping=damping),
        f"push b={batch}": lambda k: ppr(g, resets[:batch], damping=damping, method="push",
                                         eps=eps),
    }
    out = {}
    for name, call in cases.items():
        call(0)  # warm-up (compiles or loads the kernels)
        out[name] = {}
        for nt in thread_counts:
            share = [range(t, calls, nt) for t in range(nt)]
            workers = [threading.Thread(target=_call_each, args=(call, ks)) for ks in share]
            t = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            sec = time.perf_counter() - t
            out[name][nt] = {"calls_per_s": calls / sec, "ms_per_call": sec / calls * 1e3}
            print(f"{name:<14} {nt:>2} threads: {calls / sec:8.1f} calls/s "
                  f"({sec / calls * 1e3:7.2f} ms/call wall); load {os.getloadavg()[0]:.2f}")
    return out


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=97_000)
    ap.add_argument("--edges", type=int, default=1_400_000, help="undirected edges")
    ap.add_argument("--db", type=Path, help="hipgraph index folder (or graph.duckdb) to read")
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=10, help="at most this many entity seeds")
    ap.add_argument("--passages", type=int, default=1000, help="seeded passages (dense reset)")
    ap.add_argument("--shapes", nargs="+", default=["sparse", "dense"], choices=["sparse", "dense"])
    ap.add_argument("--damping", type=float, default=0.5)
    ap.add_argument("--tol", type=float, default=1e-8)
    ap.add_argument("--eps", type=float, nargs="+", default=None,
                    help="push thresholds (default: 1e-5 3e-6 1e-6 3e-7 1e-7; ppr() uses 1e-6)")
    ap.add_argument("--no-scipy", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write all figures to this JSON file")
    ap.add_argument("--threads", type=int, nargs="+",
                    help="only measure ppr() throughput from this many Python threads at once")
    args = ap.parse_args()

    t0 = time.perf_counter()
    if args.db:
        n, n_p, src, dst, w = db_graph(args.db)
    else:
        n, n_p, src, dst, w = synthetic_graph(args.nodes, args.edges, args.seed)
    indptr, indices, weights = to_csr(n, src, dst, w, undirected=True)
    t_csr = time.perf_counter() - t0
    deg = np.diff(indptr)
    m = indices.size
    t = time.perf_counter()
    g = prepare_graph(indptr, indices, weights, symmetric=True)
    t_prep = time.perf_counter() - t
    t = time.perf_counter()
    prepare_graph(indptr, indices, weights, symmetric=True)
    t_prep = min(t_prep, time.perf_counter() - t)
    load = os.getloadavg()
    info = {
        "graph": str(args.db) if args.db else "synthetic",
        "nodes": n, "passages": n_p, "directed_edges": m, "max_degree": int(deg.max()),
        "isolated": int((deg == 0).sum()), "csr_build_s": t_csr, "prepare_s": t_prep,
        "damping": args.damping, "tol": args.tol, "queries": args.queries, "batch": args.batch,
        "threads": numba.get_num_threads(), "loadavg_start": load,
    }
    print(f"graph {info['graph']}: {n} nodes ({n_p} passages), {m} directed edges "
          f"({m // 2} undirected), max degree {deg.max()}, isolated {info['isolated']}; "
          f"to_csr {t_csr:.1f}s, prepare_graph {t_prep * 1e3:.0f} ms; "
          f"numba threads {numba.get_num_threads()}; load {load[0]:.2f}")

    rng = np.random.default_rng(args.seed + 1)
    nq, bsz = args.queries, args.batch
    all_resets = make_resets(rng, n, n_p, max(nq, bsz), args.seeds, args.passages, deg)
    d, tol = args.damping, args.tol
    eps_list = args.eps or [1e-5, 3e-6, 1e-6, 3e-7, 1e-7]
    if args.threads:
        sparse = all_resets["sparse"]
        info["thread_throughput"] = thread_throughput(
            g, sparse, args.threads, min(bsz, sparse.shape[0]), d, 1e-6)
        if args.json:
            args.json.write_text(json.dumps(info, indent=2), encoding="utf-8")
        return

    import igraph

    srcs = np.repeat(np.arange(n), deg)
    ig = igraph.Graph(n=n, edges=np.column_stack([srcs, indices]).tolist(), directed=True)
    ig.es["weight"] = weights.tolist()

    sp = None
    if not args.no_scipy:
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
            r = r / r.sum()
            x = r.copy()
            for _ in range(100):
                y = d * (pt @ x) + (d * x[dangling].sum() + 1 - d) * r
                done = np.abs(y - x).sum() < tol
                x = y
                if done:
                    break
            return x / x.sum()

    gbs1, gbs = read_bandwidth_gbs()
    report = {"info": info, "read_bandwidth_gbs": {"1_thread": gbs1, "all_threads": gbs},
              "shapes": {}}
    for shape in args.shapes:
        resets = all_resets[shape]
        rq = resets[:nq]
        nnz = float(np.count_nonzero(rq, axis=1).mean())
        rows: dict[str, dict] = {}

        def igraph_ppr(r):
            return np.asarray(ig.personalized_pagerank(
                directed=True, weights="weight", reset=r.tolist(), damping=d))

        sec, ref = per_query(igraph_ppr, rq)
        rows["igraph PRPACK"] = {"ms": sec * 1e3}
        if sp is not None:
            sec, out = per_query(scipy_ppr, rq)
            rows["scipy power"] = {"ms": sec * 1e3, **agreement(out, ref, n_p)}
        sec, out = per_query(lambda r: ppr(g, r, damping=d, tol=tol), rq, reps=2)
        rows["hipgraph exact"] = {"ms": sec * 1e3, **agreement(out, ref, n_p)}
        batch = resets[:bsz]
        ppr(g, batch, damping=d, tol=tol)
        best = np.inf
        for _ in range(2):
            t = time.perf_counter()
            out = ppr(g, batch, damping=d, tol=tol)
            best = min(best, time.perf_counter() - t)
        rows[f"hipgraph batched b={bsz}"] = {
            "ms": best / bsz * 1e3, **agreement(out[: min(nq, bsz)], ref[: min(nq, bsz)], n_p)}
        for eps in eps_list:
            sec, out = per_query(
                lambda r, eps=eps: ppr(g, r, damping=d, method="push", eps=eps), rq, reps=2)
            rows[f"hipgraph push eps={eps:g}"] = {"ms": sec * 1e3, **agreement(out, ref, n_p)}
        base = rows["igraph PRPACK"]["ms"]
        for row in rows.values():
            row["speedup"] = base / row["ms"]

        # memory-bandwidth floor of the exact single-query kernel (serial): graph arrays plus
        # the vectors it streams per iteration, at the one-thread read bandwidth
        from hipgraph.query.ppr.front import _power

        r_norm = rq[:1] / rq[:1].sum()
        _, iters = _power(g, r_norm, d, tol, 100)
        if g.symmetric:  # CG: matvec (p, q), update (y, p, res, q -> y, res), p update
            vec = 2 + 6 + 3
            val = g.sym_weight
        else:  # power: x, y, reset
            vec = 3
            val = g.tprob
        bytes_iter = (
            g.tindptr.itemsize * (n + 1) + (g.tindices.itemsize + val.itemsize) * m + 8 * n * vec
        )
        floor_ms = bytes_iter * iters / (gbs1 * 1e9) * 1e3
        rows["hipgraph exact"]["floor_ms"] = floor_ms
        rows["hipgraph exact"]["iterations"] = int(iters)
        rows["hipgraph exact"]["vs_floor"] = rows["hipgraph exact"]["ms"] / floor_ms
        report["shapes"][shape] = {"nonzeros_per_reset": nnz, "rows": rows,
                                   "bytes_per_iteration": bytes_iter, "loadavg": os.getloadavg()}

        print(f"\n[{shape} reset: {nnz:.0f} nonzeros/query, {nq} queries] "
              f"load {os.getloadavg()[0]:.2f}")
        hdr = (f"{'method':<28}{'ms/query':>10}{'vs igraph':>10}{'L1 mean':>10}{'L1 max':>10}"
               f"{'top20':>7}{'same10':>8}{'same10 P':>9}")
        print(hdr)
        for name, row in rows.items():
            if name == "igraph PRPACK":
                print(f"{name:<28}{row['ms']:>10.3f}{1.0:>9.1f}x")
                continue
            p10 = row.get("same_top10_passages", float("nan"))
            print(f"{name:<28}{row['ms']:>10.3f}{row['speedup']:>9.1f}x{row['l1_mean']:>10.1e}"
                  f"{row['l1_max']:>10.1e}{row['top20_overlap']:>7.3f}{row['same_top10']:>8.2f}"
                  f"{p10:>9.2f}")
        ex = rows["hipgraph exact"]
        pushes = {k: v for k, v in rows.items() if k.startswith("hipgraph push")}
        ok_push = [k for k, v in pushes.items() if v["speedup"] >= 50 and v["same_top10"] >= 0.95]
        targets = {
            "exact >= 5x igraph": ex["speedup"] >= 5,
            "exact <= 2x floor": ex["ms"] <= 2 * floor_ms,
            "batched >= 20x igraph": rows[f"hipgraph batched b={bsz}"]["speedup"] >= 20,
            "push >= 50x igraph with same top-10 on >= 95%": ok_push,
        }
        report["shapes"][shape]["targets"] = targets
        print(f"floor (exact, b=1, one thread): {iters} iterations x {bytes_iter / 1e6:.1f} MB "
              f"at {gbs1:.1f} GB/s read = {floor_ms:.3f} ms/query; exact is "
              f"{ex['vs_floor']:.2f}x the floor ({gbs:.1f} GB/s with "
              f"{numba.get_num_threads()} threads)")
        print("targets: " + "; ".join(
            f"{k}: {('met by ' + ', '.join(v)) if isinstance(v, list) and v else bool(v)}"
            for k, v in targets.items()))
    print("\n(vs igraph = igraph time / method time; same10 = share of queries whose top-10 node "
          "set equals igraph's; same10 P = the same over passage nodes; top20 = mean overlap)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2), encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
