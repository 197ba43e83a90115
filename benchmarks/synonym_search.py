"""Synonym candidate search on an IVF entity index: lists probed against pairs found and time.

    python benchmarks/synonym_search.py --db indexes/musique --db indexes/2wiki [--nprobe 4,8,16,32,0]
    python benchmarks/synonym_search.py --synthetic 200000
    python benchmarks/synonym_search.py --db indexes/musique --hnsw 16,32,64   # also HNSW rows
    python benchmarks/synonym_search.py --synthetic 1000000 --batches 32,128,512,4096

Synonym edges join entities whose name vectors have cosine >= 0.8 (``SynonymConfig.threshold``).
Each batch searches its new entities against the entity index: exact (flat, BLAS) below
``VectorIndexConfig.auto_threshold`` entities, IVF-SQ8 from there. This measures, over one set of
entity vectors (an index's own, several indexes' together, or ``--synthetic N`` names of
``scale.py``'s corpus embedded with its hashing embedder), the all-pairs range search at the
threshold minus the SQ8 candidate margin through IVF-SQ8 (nlist 2*sqrt(n), as the index builds
it) for each ``--nprobe`` (0: the index's own, max(32, nlist/8)), against the exact pairs from
a flat BLAS search of the same vectors: the share of pairs found (each found candidate is then
decided on its exact cosine, so no pair is ever wrong, only missed) and the wall time.

``--batches M,...`` measures one write batch instead: M new names (drawn at random, the largest M
held out) against an IVF-SQ8 index of all the others, through FAISS's range search (one query at
a time) and through one matrix product per probed list (``FaissVectorIndex`` picks the latter once
a call probes each list ``IVF_BLAS_QUERIES_PER_LIST`` times on average), and checks that both
find the same candidates.

``--hnsw EF,...`` adds one row per HNSW ``efSearch`` for a sublinear candidate search: each name's
``max_neighbors + 1`` nearest neighbours through an HNSW graph (float vectors, M 32, built once,
its build time counted), and an exact range search only for the names whose last neighbour is
still above the threshold (they may have more than ``max_neighbors`` pairs, so they are no
edge's end, but every pair of theirs counts in the degree of the other end).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import faiss  # noqa: E402

from hipgraph.config import VectorIndexConfig  # noqa: E402
from hipgraph.indexers.graph_update import _similar_within  # noqa: E402
from hipgraph.store import vectors as vectors_module  # noqa: E402
from hipgraph.store.vectors import FLOAT_CANDIDATE_MARGIN, SQ8_CANDIDATE_MARGIN, FaissVectorIndex  # noqa: E402


def index_vectors(dbs: list[Path]) -> np.ndarray:
    import hipgraph  # noqa: PLC0415

    parts = []
    for db in dbs:
        with hipgraph.open(db, read_only=True) as hg:
            parts.extend(v for _, v in hg.store.iter_vectors("entity"))
    return np.ascontiguousarray(np.vstack(parts), dtype=np.float32)


def synthetic_vectors(n_passages: int) -> np.ndarray:
    import scale  # noqa: PLC0415

    from hipgraph import registry  # noqa: PLC0415
    from hipgraph.config import EmbedderConfig  # noqa: PLC0415

    docs, _ = scale.synthetic_corpus(n_passages)
    names = sorted({name for d in docs for m in scale._SENTENCE.findall(d["text"]) for name in (m[0], m[2], m[3])})
    embedder = registry.create("embedder", "hashing", EmbedderConfig(name="hashing"))
    return np.ascontiguousarray(embedder.embed(names), dtype=np.float32)


def exact_pairs(vectors: np.ndarray, threshold: float) -> set[tuple[int, int]]:
    """Row pairs ``(a, b)``, ``a < b``, that are synonym pairs by the indexer's own exact rule."""
    return {(a, b) for a, b, _ in _similar_within(list(range(len(vectors))), vectors, threshold)}


def edges(pairs: set[tuple[int, int]], cap: int) -> set[tuple[int, int]]:
    """The synonym edges of ``pairs``: both ends with at most ``cap`` such pairs."""
    degree: dict[int, int] = {}
    for a, b in pairs:
        degree[a] = degree.get(a, 0) + 1
        degree[b] = degree.get(b, 0) + 1
    return {(a, b) for a, b in pairs if degree[a] <= cap and degree[b] <= cap}


def quality(found: set, exact: set, exact_edges: set, cap: int) -> str:
    """Table cells for candidate pairs ``found``, each decided on its exact cosine (so only
    ``found & exact`` count): pairs found, missed, edges missed and edges extra."""
    found = found & exact
    got = edges(found, cap)
    missed = len(exact_edges - got)
    return (f"{100 * len(found) / max(1, len(exact)):.2f}% | {len(exact) - len(found)} | "
            f"{missed} ({100 * missed / max(1, len(exact_edges)):.2f}%) | {len(got - exact_edges)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, action="append", default=[])
    parser.add_argument("--synthetic", type=int, default=0, help="passages of scale.py's synthetic corpus")
    parser.add_argument("--nprobe", default="4,8,16,32,0")
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("--max-neighbors", type=int, default=32)
    parser.add_argument("--hnsw", default="", help="efSearch values for HNSW rows (none by default)")
    parser.add_argument("--batches", default="", help="new-name counts of single batches (instead of all pairs)")
    args = parser.parse_args()
    vectors = synthetic_vectors(args.synthetic) if args.synthetic else index_vectors(args.db)
    if args.batches:
        return batch_rows(vectors, [int(x) for x in args.batches.split(",")], args.threshold)
    n, d = vectors.shape
    config = VectorIndexConfig()
    nlist = config.nlist(n)
    t0 = time.perf_counter()
    exact = exact_pairs(vectors, args.threshold)
    t_flat = time.perf_counter() - t0
    ivf = FaissVectorIndex(d, VectorIndexConfig(kind="ivf", use_gpu="never"))  # as the indexer builds it
    ivf.build(np.arange(n, dtype=np.int64), vectors)
    exact_edges = edges(exact, args.max_neighbors)
    print(f"{n} entity vectors ({', '.join(map(str, args.db)) or f'synthetic {args.synthetic}'}), "
          f"{len(exact)} pairs >= {args.threshold}, {len(exact_edges)} edges (both ends <= {args.max_neighbors} "
          f"pairs); flat exact all-pairs {t_flat:.1f} s; IVF-SQ8 nlist {nlist}")
    print("| nprobe | share of lists | pairs found | missed | edges missed | edges extra "
          "| all-pairs s, FAISS scan | vs flat | all-pairs s, list products | vs flat |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for raw in args.nprobe.split(","):
        nprobe = int(raw) or config.nprobe(nlist)
        cells, results = [], []
        for seconds, found in both_searches(ivf, vectors, args.threshold - SQ8_CANDIDATE_MARGIN, nprobe):
            cells.append(f"{seconds:.1f} | {seconds / t_flat:.2f}")
            results.append({(a, b) for a, b in found if a < b})
        same = "" if results[0] == results[1] else f" (the two searches differ in {len(results[0] ^ results[1])} pairs)"
        print(f"| {nprobe}{' (default)' if raw == '0' else ''} | {nprobe / nlist:.3f} | "
              f"{quality(results[0], exact, exact_edges, args.max_neighbors)} | {' | '.join(cells)} |{same}",
              flush=True)
    if args.hnsw:
        hnsw_rows(vectors, exact, exact_edges, t_flat, args)
    return 0


def both_searches(ivf: FaissVectorIndex, queries: np.ndarray, search: float, nprobe: int
                  ) -> list[tuple[float, set[tuple[int, int]]]]:
    """``(seconds, {(query row, id)})`` of the range search over ``queries`` (in calls of 4,096
    rows, as a build's batch) through FAISS's scan per query, then through one matrix product per
    probed list."""
    default = vectors_module.IVF_BLAS_QUERIES_PER_LIST
    runs = []
    try:
        for per_list in (10**12, 0):
            vectors_module.IVF_BLAS_QUERIES_PER_LIST = per_list
            t0 = time.perf_counter()
            found = set()
            for lo in range(0, len(queries), 4096):
                hits = ivf.range_search(queries[lo:lo + 4096], search, nprobe=nprobe)
                found |= {(lo + q, int(j)) for q, (ids, _) in enumerate(hits) for j in ids.tolist()}
            runs.append((time.perf_counter() - t0, found))
    finally:
        vectors_module.IVF_BLAS_QUERIES_PER_LIST = default
    return runs


def batch_rows(vectors: np.ndarray, sizes: list[int], threshold: float) -> int:
    vectors = vectors[np.random.default_rng(0).permutation(len(vectors))]
    held = len(vectors) - max(sizes)
    ivf = FaissVectorIndex(vectors.shape[1], VectorIndexConfig(use_gpu="never"))  # the default layout
    ivf.build(np.arange(held, dtype=np.int64), vectors[:held])
    if ivf.layout != "ivf":
        print(f"{held} held vectors are below the IVF threshold: nothing to compare")
        return 1
    nlist, nprobe = int(ivf._inner.nlist), int(ivf._inner.nprobe)
    print(f"one batch of new names against {held} held (IVF-SQ8, nlist {nlist}, nprobe {nprobe}); "
          f"list products from {vectors_module.IVF_BLAS_QUERIES_PER_LIST} queries per list")
    print("| new names | queries per list | FAISS scan ms | list products ms | same candidates |")
    print("|---|---|---|---|---|")
    for m in sizes:
        runs = both_searches(ivf, vectors[held:held + m], threshold - SQ8_CANDIDATE_MARGIN, 0)
        cells = [f"{1000 * seconds:.0f}" for seconds, _ in runs]
        found = [pairs for _, pairs in runs]
        print(f"| {m} | {m * nprobe / nlist:.1f} | {' | '.join(cells)} | {found[0] == found[1]} ({len(found[0])}) |",
              flush=True)
    return 0


def hnsw_rows(vectors: np.ndarray, exact: set, exact_edges: set, t_flat: float, args) -> None:
    n, d = vectors.shape
    k = args.max_neighbors + 2  # the name itself, its max_neighbors pairs, one more
    t0 = time.perf_counter()
    hnsw = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(vectors)
    t_build = time.perf_counter() - t0
    flat = faiss.IndexFlatIP(d)
    flat.add(vectors)
    search = args.threshold - FLOAT_CANDIDATE_MARGIN  # float vectors, as the index searches them
    print(f"HNSW (M 32, float vectors) built in {t_build:.1f} s; k = {k} nearest per name")
    print("| efSearch | pairs found | missed | edges missed | edges extra | range-searched names | s (with build) | vs flat |")
    print("|---|---|---|---|---|---|---|---|")
    for ef in (int(x) for x in args.hnsw.split(",")):
        hnsw.hnsw.efSearch = ef
        t0 = time.perf_counter()
        scores, ids = hnsw.search(vectors, k)
        queries, columns = np.nonzero(scores >= search)
        neighbours = ids[queries, columns]
        keep = (neighbours >= 0) & (neighbours != queries)
        found = {(min(a, b), max(a, b)) for a, b in zip(queries[keep].tolist(), neighbours[keep].tolist(), strict=True)}
        full = np.flatnonzero(scores[:, -1] >= search)  # may have more pairs than k holds
        for lo in range(0, len(full), 4096):
            rows = full[lo:lo + 4096]
            lims, _, hits = flat.range_search(vectors[rows], search)
            for i, q in enumerate(rows.tolist()):
                found |= {(min(q, int(j)), max(q, int(j))) for j in hits[lims[i]:lims[i + 1]] if j != q}
        seconds = time.perf_counter() - t0 + t_build
        print(f"| {ef} | {quality(found, exact, exact_edges, args.max_neighbors)} | {len(full)} | "
              f"{seconds:.1f} | {seconds / t_flat:.2f} |", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
