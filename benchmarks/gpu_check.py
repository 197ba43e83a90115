"""GPU check: index a bundle with the embedder on each device of one machine and compare.

For each device named in ``--devices`` (default ``cuda,cpu``), in a fresh subprocess of this
script: ``hipgraph.open(create=True)`` with ``EmbedderConfig(device=...)`` (precision ``auto``:
bf16 on CUDA, and on CPUs that compute bf16 natively), ``add_documents`` over the bundle's corpus
(``--workers``: the same executor for every device), then every question of the bundle once per
mode (``--modes``, after a warm-up), timing each ``retrieve``. FAISS searches on the GPU where the
installed FAISS build sees one (``faiss-gpu``); the run prints which build it had.

Then, in this process, what the devices agree on:

- stored vectors: cosine between the two indexes' vectors of the same passage (document key and
  ordinal) and of the same entity (name and label): minimum and mean;
- rankings: per mode, the share of questions whose top-5 documents are the same list, the mean
  overlap of the top-5 sets, and recall@2/@5 against the bundle's ``gold_idx`` on each device.

Printed: passages/s of each device, the ratio to the first, query p50/p95 per mode and device.
Throughput on a shared machine varies; the figures are for one run on the machine it ran on.

    python benchmarks/gpu_check.py --bundle ../shared/data/multihop/2wiki_dev101.json --out /tmp/gpu
    python benchmarks/gpu_check.py --devices cpu --limit 200 --out /tmp/gpu   # a CPU-only dry run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
DEFAULT_BUNDLE = (REPO_ROOT / ".." / "shared" / "data" / "multihop" / "2wiki_dev101.json").resolve()
TOP = 5  # rankings are compared over the top TOP documents


def log(msg: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    """What the run ran on: CPU model and count, GPU name, torch and FAISS builds."""
    info: dict[str, Any] = {"cpus": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    info["torch"] = torch.__version__
    info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    import faiss

    from hipgraph.store.vectors import gpu_count

    info["faiss"] = getattr(faiss, "__version__", "?")
    info["faiss_gpus"] = gpu_count()
    return info


# ---------------------------------------------------------------------- one device (subprocess)
def run_device(args: argparse.Namespace) -> dict[str, Any]:
    import dataclasses

    import hipgraph
    from hipgraph.evaluation import distinct_docs, load_bundle

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from index_throughput import load_records
    from query_latency import percentile

    device, out = args._device, Path(args._db)
    shutil.rmtree(out, ignore_errors=True)
    records = load_records(args.bundle, args.limit)
    questions = load_bundle(args.bundle)["questions"]
    if args.questions:
        questions = questions[: args.questions]
    config = hipgraph.IndexConfig()
    config = config.replace(embedder=dataclasses.replace(config.embedder, device=device))
    result: dict[str, Any] = {"device": device, "machine": machine()}

    t0 = time.perf_counter()
    hg = hipgraph.open(out, create=True, config=config)
    hg.embedder.embed(["Warm-up\nLoads the embedding model."])
    result["load_seconds"] = time.perf_counter() - t0
    result["precision"] = getattr(hg.embedder, "precision", None)
    log(f"{device}: indexing {len(records)} documents (workers {args.workers})")
    t0 = time.perf_counter()
    report = hg.add_documents(records, workers=args.workers)
    seconds = time.perf_counter() - t0
    stats = dict(hg.stats())
    result["index"] = {"seconds": seconds, "documents": len(records),
                       "passages": int(stats.get("passages", 0)),
                       "passages_per_s": int(stats.get("passages", 0)) / seconds,
                       "stage_seconds": dict(getattr(report, "seconds", {}) or {})}
    log(f"{device}: {result['index']['passages']} passages in {seconds:.1f}s "
        f"({result['index']['passages_per_s']:.1f}/s)")

    result["modes"] = {}
    for mode in args.modes.split(","):
        for q in questions[:3]:  # warm-up: model, numba kernels, snapshot and BM25 caches
            hg.retrieve(q["question"], k=10, mode=mode)
        times, ranked = [], []
        for q in questions:
            t = time.perf_counter()
            hits = hg.retrieve(q["question"], k=10, mode=mode)
            times.append((time.perf_counter() - t) * 1000)
            ranked.append({"id": q.get("id"), "docs": distinct_docs(hits),
                           "scores": [h.score for h in hits]})
        result["modes"][mode] = {"p50_ms": statistics.median(times),
                                 "p95_ms": percentile(times, 0.95), "ranked": ranked}
        log(f"{device}: {mode} p50 {statistics.median(times):.1f} ms")
    # a GPU copy of an index is made at its first search where FAISS sees a GPU
    result["faiss_on_gpu"] = {kind: ix.on_gpu for kind, ix in hg.vectors.indexes.items()}
    hg.close()
    return result


# ---------------------------------------------------------------------- comparison (parent)
def vector_agreement(db_a: Path, db_b: Path) -> dict[str, Any]:
    """Cosine between the two indexes' vectors of the same passage and the same entity."""
    import duckdb
    import numpy as np

    con = duckdb.connect()
    con.execute(f"ATTACH '{db_a / 'graph.duckdb'}' AS a (READ_ONLY)")
    con.execute(f"ATTACH '{db_b / 'graph.duckdb'}' AS b (READ_ONLY)")
    out: dict[str, Any] = {}
    queries = {
        "passages": """
            SELECT va.vec, vb.vec FROM a.passages pa JOIN a.documents da ON da.id = pa.doc_id
            JOIN a.passage_vectors va ON va.id = pa.id
            JOIN b.documents db ON db.key = da.key
            JOIN b.passages pb ON pb.doc_id = db.id AND pb.ordinal = pa.ordinal
            JOIN b.passage_vectors vb ON vb.id = pb.id""",
        "entities": """
            SELECT va.vec, vb.vec FROM a.entities ea JOIN a.entity_vectors va ON va.id = ea.id
            JOIN b.entities eb ON eb.name = ea.name AND eb.label = ea.label
            JOIN b.entity_vectors vb ON vb.id = eb.id""",
    }
    for name, sql in queries.items():
        rows = con.execute(sql).fetchall()
        if not rows:
            out[name] = {"pairs": 0}
            continue
        a = np.asarray([r[0] for r in rows], dtype=np.float32)
        b = np.asarray([r[1] for r in rows], dtype=np.float32)
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        out[name] = {"pairs": len(rows), "min_cos": float(cos.min()), "mean_cos": float(cos.mean()),
                     "below_0.999": int((cos < 0.999).sum())}
    con.close()
    return out


def ranking_agreement(first: dict[str, Any], other: dict[str, Any],
                      gold: dict[str, list[str]]) -> dict[str, Any]:
    from hipgraph.evaluation import recall_at

    out = {}
    for mode, res in first["modes"].items():
        if mode not in other["modes"]:
            continue
        pairs = list(zip(res["ranked"], other["modes"][mode]["ranked"], strict=True))
        same = sum(a["docs"][:TOP] == b["docs"][:TOP] for a, b in pairs)
        overlap = [len(set(a["docs"][:TOP]) & set(b["docs"][:TOP])) / TOP for a, b in pairs]
        row = {"questions": len(pairs), "same_top5_share": same / len(pairs),
               "mean_top5_overlap": statistics.mean(overlap)}
        for k in (2, 5):
            for label, r in (("first", res), ("other", other["modes"][mode])):
                vals = [recall_at(gold.get(str(x["id"]), []), x["docs"], k) for x in r["ranked"]
                        if gold.get(str(x["id"]))]
                row[f"recall@{k}_{label}"] = statistics.mean(vals) if vals else None
        out[mode] = row
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=DEFAULT_BUNDLE)
    parser.add_argument("--out", type=Path, required=True, help="folder for the indexes and JSON")
    parser.add_argument("--devices", default="cuda,cpu")
    parser.add_argument("--modes", default="graph,dense,hybrid")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes for add_documents (default: this process)")
    parser.add_argument("--limit", type=int, default=None, help="first N documents only")
    parser.add_argument("--questions", type=int, default=None, help="first N questions only")
    parser.add_argument("--_device", help=argparse.SUPPRESS)
    parser.add_argument("--_db", help=argparse.SUPPRESS)
    parser.add_argument("--_json", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args._device:
        result = run_device(args)
        Path(args._json).write_text(json.dumps(result))
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for device in args.devices.split(","):
        db, out_json = args.out / f"index-{device}", args.out / f"{device}.json"
        cmd = [sys.executable, __file__, "--bundle", str(args.bundle), "--out", str(args.out),
               "--modes", args.modes, "--_device", device, "--_db", str(db), "--_json", str(out_json)]
        for flag, value in (("--workers", args.workers), ("--limit", args.limit),
                            ("--questions", args.questions)):
            if value is not None:
                cmd += [flag, str(value)]
        rc = subprocess.call(cmd)
        if rc != 0:
            log(f"{device}: subprocess failed with status {rc}")
            return 1
        results.append(json.loads(out_json.read_text()))

    from hipgraph.evaluation import load_bundle

    gold = {str(q.get("id")): [str(g) for g in q.get("gold_idx") or []]
            for q in load_bundle(args.bundle)["questions"]}
    first = results[0]
    print(f"machine: {json.dumps(first['machine'])}")
    print(f"\n{'device':<6} {'precision':<9} {'passages':>8} {'seconds':>8} {'passages/s':>10} "
          f"{'ratio':>6} {'faiss on GPU':>12}")
    for r in results:
        ix = r["index"]
        print(f"{r['device']:<6} {r['precision']!s:<9} {ix['passages']:>8} {ix['seconds']:>8.1f} "
              f"{ix['passages_per_s']:>10.1f} {ix['passages_per_s'] / first['index']['passages_per_s']:>6.2f} "
              f"{any(r['faiss_on_gpu'].values())!s:>12}")
    print(f"\n{'mode':<8} " + " ".join(f"{r['device'] + ' p50':>10} {r['device'] + ' p95':>10}"
                                         for r in results))
    for mode in first["modes"]:
        print(f"{mode:<8} " + " ".join(f"{r['modes'][mode]['p50_ms']:>10.1f} "
                                       f"{r['modes'][mode]['p95_ms']:>10.1f}" for r in results))
    summary: dict[str, Any] = {"results": [{k: v for k, v in r.items() if k != "modes"}
                                           for r in results],
                               "latency": {r["device"]: {m: {"p50_ms": v["p50_ms"], "p95_ms": v["p95_ms"]}
                                                          for m, v in r["modes"].items()}
                                           for r in results}}
    for other in results[1:]:
        pair = f"{first['device']} vs {other['device']}"
        vectors = vector_agreement(args.out / f"index-{first['device']}",
                                   args.out / f"index-{other['device']}")
        rankings = ranking_agreement(first, other, gold)
        summary[pair] = {"vectors": vectors, "rankings": rankings}
        print(f"\n{pair}: stored vectors")
        for name, v in vectors.items():
            print(f"  {name:<9} {json.dumps(v)}")
        print(f"{pair}: rankings (top {TOP} documents)")
        for mode, row in rankings.items():
            print(f"  {mode:<8} same list {row['same_top5_share']:.3f}  overlap "
                  f"{row['mean_top5_overlap']:.3f}  recall@2 {row['recall@2_first']:.3f}/"
                  f"{row['recall@2_other']:.3f}  recall@5 {row['recall@5_first']:.3f}/"
                  f"{row['recall@5_other']:.3f}")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
