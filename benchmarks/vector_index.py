"""What the FAISS layouts trade: recall@10 against exact search, query time and memory.

    python benchmarks/vector_index.py --db indexes/musique --bundle ../shared/data/multihop/musique_train100.json
    python benchmarks/vector_index.py --db /tmp/hipgraph-scale/n100000-synthetic --kind fact --synthetic-questions 100000

The vectors are an index's own (every kind, or ``--kind``), read from DuckDB; the queries are a
bundle's questions embedded with the index's embedder (or the scale benchmark's synthetic
questions). Each layout is built over the same vectors with ids, and its top-10 for every query is
compared with exact inner-product search (``flat``). Printed: build seconds, bytes per vector of
the serialized index, p50 search milliseconds per single query on one thread, and recall@10.
The ``auto`` default uses IVF-SQ8 (nlist 2*sqrt(n), nprobe max(32, nlist/8)) from 100k vectors per kind.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load(db: Path, kind: str | None) -> tuple[np.ndarray, np.ndarray, object]:
    import hipgraph  # noqa: PLC0415

    hg = hipgraph.open(db, read_only=True)
    kinds = [kind] if kind else ["passage", "entity", "fact"]
    ids, vecs = [], []
    offset = 0
    for k in kinds:
        for i, v in hg.store.iter_vectors(k):
            ids.append(i + offset)
            vecs.append(v)
        offset += 1 << 40  # keep ids of different kinds apart
    return np.concatenate(ids), np.concatenate(vecs), hg


def questions(args, hg) -> np.ndarray:
    if args.bundle:
        texts = [q["question"] for q in json.loads(Path(args.bundle).read_text())["questions"]]
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        from scale import synthetic_corpus  # noqa: PLC0415

        docs, texts = synthetic_corpus(args.synthetic_questions)
        for _ in docs:  # the questions are drawn while the corpus streams
            pass
    return hg.embedder.embed(texts[: args.queries])


def measure(name: str, config, ids, vecs, queries, exact_top) -> dict:
    import faiss  # noqa: PLC0415

    from hipgraph.store.vectors import FaissVectorIndex  # noqa: PLC0415

    faiss.omp_set_num_threads(1)
    index = FaissVectorIndex(vecs.shape[1], config)
    t0 = time.perf_counter()
    index.build(ids, vecs)
    build = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.faiss"
        index.save(path)
        size = path.stat().st_size
    times, found = [], []
    for q in queries:
        t = time.perf_counter()
        _, top = index.search(q[None, :], 10)
        times.append(1000 * (time.perf_counter() - t))
        found.append(top[0])
    recall = float(np.mean([len(set(f.tolist()) & set(e.tolist())) / 10 for f, e in zip(found, exact_top, strict=True)]))
    return {"layout": name, "build_s": round(build, 2), "bytes_per_vector": round(size / len(ids), 1),
            "search_p50_ms": round(statistics.median(times), 3), "recall@10": round(recall, 4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--kind", choices=("passage", "entity", "fact"), default=None)
    parser.add_argument("--bundle", default=None)
    parser.add_argument("--synthetic-questions", type=int, default=10000, help="corpus size of scale.py's questions")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--nprobe", default="8,16,32,64")
    parser.add_argument("--no-hnsw", action="store_true", help="skip HNSW (slow to build on many vectors)")
    parser.add_argument("--encodings", default="sq8,flat")
    args = parser.parse_args()

    from hipgraph.config import VectorIndexConfig  # noqa: PLC0415

    ids, vecs, hg = load(args.db, args.kind)
    queries = questions(args, hg)
    print(f"{len(ids)} vectors of {args.kind or 'every kind'} from {args.db}, {len(queries)} queries", file=sys.stderr)
    exact = VectorIndexConfig(kind="flat", use_gpu="never")
    flat = measure("flat (exact)", exact, ids, vecs, queries, [np.zeros(0)] * len(queries))
    from hipgraph.store.vectors import FaissVectorIndex  # noqa: PLC0415

    ref = FaissVectorIndex(vecs.shape[1], exact)
    ref.build(ids, vecs)
    exact_top = [ref.search(q[None, :], 10)[1][0] for q in queries]
    flat["recall@10"] = 1.0
    rows = [flat]
    for encoding in args.encodings.split(","):
        for nprobe in [int(x) for x in args.nprobe.split(",")]:
            cfg = VectorIndexConfig(kind="ivf", min_train_size=1, ivf_nprobe=nprobe, ivf_encoding=encoding,
                                    use_gpu="never")
            label = f"ivf-{encoding} nlist={cfg.nlist(len(ids))} nprobe={nprobe}"
            rows.append(measure(label, cfg, ids, vecs, queries, exact_top))
    auto = VectorIndexConfig(kind="ivf", min_train_size=1, use_gpu="never")
    label = f"auto default: ivf-sq8 nlist={auto.nlist(len(ids))} nprobe={auto.nprobe(auto.nlist(len(ids)))}"
    rows.append(measure(label, auto, ids, vecs, queries, exact_top))
    if not args.no_hnsw:
        rows.append(measure("hnsw M=32 ef=128", VectorIndexConfig(kind="hnsw", use_gpu="never"), ids, vecs, queries,
                            exact_top))
    print(f"{'layout':38s} {'build s':>8s} {'B/vector':>9s} {'p50 ms':>8s} {'recall@10':>10s}")
    for r in rows:
        print(f"{r['layout']:38s} {r['build_s']:8.2f} {r['bytes_per_vector']:9.1f} {r['search_p50_ms']:8.3f} "
              f"{r['recall@10']:10.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
