"""The MiniLM embedder on torch against ONNX Runtime: agreement, question latency, batch
throughput, and what the runtime does to retrieval.

    python benchmarks/embedder_runtime.py --bundle ../shared/data/multihop/musique_train100.json \\
        [--index indexes/musique=../shared/data/multihop/musique_train100.json ...]

Part 1, the model (texts: the bundle's questions and passages, and short names from its titles):
for torch (the precision ``auto`` resolves to on this CPU, and fp32), ONNX fp32 and ONNX int8,
the export's verdict (lowest cosine to torch fp32 on the fixed probe texts), the cosine to torch
fp32 over the bundle's texts (min, mean), one question a call on one thread (p50, p95; a call of
up to ``small_batch`` texts runs on one thread), and passages/s in calls of 256 on all threads.

Part 1b, one question, interleaved (each question through every path in turn, ``--rounds``
times, so that drift in the machine's speed falls on all alike): ``embed([question])`` on the
default trace (linear layers on prepacked weights), on the plain trace, on ONNX fp32 and on
eager torch; p50, p95 and the ratio to the plain trace, the reference.

Part 2, retrieval, for each ``--index DB=BUNDLE``: recall@2/@5 per mode with every question
embedded by torch and by ONNX fp32 (the index's stored vectors are the same in both), and
single-call ``retrieve`` p50 per mode with ``runtime=torch`` and with the default ``auto``.
The reference for every ratio is torch, measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import hipgraph  # noqa: E402
from hipgraph.config import EmbedderConfig  # noqa: E402
from hipgraph.evaluation import distinct_docs, evaluate, load_bundle, recall_at  # noqa: E402
from hipgraph.models.embedders import MiniLMEmbedder  # noqa: E402


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), 100 * q)) if values else float("nan")


def texts_of(bundle: Path) -> tuple[list[str], list[str], list[str]]:
    data = json.loads(bundle.read_text())
    questions = [q["question"] for q in data["questions"]]
    passages = [f"{c['title']}\n{c['text']}" for c in data["corpus"]]
    names = sorted({c["title"] for c in data["corpus"]})
    return questions, passages, names


def model_rows(bundle: Path, batch: int) -> list[dict]:
    questions, passages, names = texts_of(bundle)
    sample = passages[:batch]
    probe = questions + passages[:400] + names[:300]
    reference = MiniLMEmbedder(EmbedderConfig(precision="fp32", runtime="torch")).embed(probe)
    rows = []
    for label, cfg in [("auto (the default)", EmbedderConfig()),
                       ("torch auto", EmbedderConfig(runtime="torch")),
                       ("torch fp32", EmbedderConfig(runtime="torch", precision="fp32")),
                       ("onnx fp32", EmbedderConfig(runtime="onnx", precision="fp32")),
                       ("onnx int8", EmbedderConfig(runtime="onnx", precision="int8"))]:
        emb = MiniLMEmbedder(cfg)
        emb.embed(["warm-up"])
        used = "traced torch" if emb._traced else "onnx" if emb._onnx else "torch"
        verdict = emb._traced.agreement if emb._traced else emb._onnx.verdict.agreement if emb._onnx else None
        if label == "onnx int8" and not emb._onnx:  # say what the refused export would have given
            from hipgraph.models import onnx_encoder

            enc = onnx_encoder.load_onnx_encoder(emb.path, emb._tokenizer, precision="int8",
                                                 max_length=emb.config.max_length, dimension=emb.dimension)
            verdict = enc.verdict.agreement
            vecs = enc.embed(probe, threads=1, batch_tokens=emb.config.batch_tokens)
            refused = {"refused_min_cos": round(float((vecs * reference).sum(1).min()), 5),
                       "refused_mean_cos": round(float((vecs * reference).sum(1).mean()), 5)}
        else:
            refused = {}
        cos = (emb.embed(probe) * reference).sum(1)
        for q in questions[:10]:
            emb.embed([q])
        times = []
        for q in questions * 2:
            t0 = time.perf_counter()
            emb.embed([q])
            times.append(1000 * (time.perf_counter() - t0))
        emb.embed(sample[:32])
        t0 = time.perf_counter()
        emb.embed(sample)
        pps = len(sample) / (time.perf_counter() - t0)
        rows.append({"embedder": label, "runs_on": used, "precision": getattr(emb, "precision", "?"),
                     "probe_agreement": verdict, "min_cos": round(float(cos.min()), 5),
                     "mean_cos": round(float(cos.mean()), 5), "question_p50_ms": round(pct(times, 0.5), 2),
                     "question_p95_ms": round(pct(times, 0.95), 2), "passages_per_s": round(pps, 1),
                     **refused})
    return rows


def question_rows(bundle: Path, rounds: int) -> list[dict]:
    from hipgraph.models import traced_encoder

    questions, _, _ = texts_of(bundle)
    packed = MiniLMEmbedder()
    packed.embed(["warm-up"])
    plain = MiniLMEmbedder()  # its small calls go to a plain trace of the same model
    plain._traced = traced_encoder.build_traced_encoder(
        packed._model, packed._tokenizer, packed._embed_unique, max_length=packed.config.max_length,
        dimension=packed.dimension, batch_tokens=packed.config.batch_tokens, pack=False) or False
    onnx = MiniLMEmbedder(EmbedderConfig(runtime="onnx", precision="fp32"))
    eager = MiniLMEmbedder(EmbedderConfig(runtime="torch"))
    paths = {"traced, prepacked (default)": packed, "traced, plain": plain, "onnx fp32": onnx,
             "torch eager": eager}
    times: dict[str, list[float]] = {label: [] for label in paths}
    for emb in paths.values():
        for q in questions[:10]:
            emb.embed([q])
    for _ in range(rounds):
        for q in questions:
            for label, emb in paths.items():
                t0 = time.perf_counter()
                emb.embed([q])
                times[label].append(1000 * (time.perf_counter() - t0))
    reference = pct(times["traced, plain"], 0.5)
    return [{"path": label, "runs_on": "traced" + (" packed" if emb._traced.packed else "")
             if emb._traced else "onnx" if emb._onnx else "torch",
             "p50_ms": round(pct(times[label], 0.5), 2), "p95_ms": round(pct(times[label], 0.95), 2),
             "ratio_to_plain_trace": round(pct(times[label], 0.5) / reference, 3)}
            for label, emb in paths.items()]


def retrieval_rows(db: Path, bundle: Path, modes: list[str]) -> list[dict]:
    questions = load_bundle(bundle)["questions"]
    with hipgraph.open(db, read_only=True) as probe:
        saved = probe.config.embedder
    rows = []
    for runtime in ("torch", "onnx", "auto"):
        emb = MiniLMEmbedder(dataclasses.replace(saved, runtime=runtime))
        with hipgraph.open(db, read_only=True, embedder=emb) as hg:
            row = {"index": db.name, "runtime": runtime}
            if runtime != "auto":  # recall: every question through this runtime
                for res in evaluate(hg, questions, modes, cutoffs=(2, 5)):
                    row[f"{res.mode} R@2"], row[f"{res.mode} R@5"] = res.recall[2], res.recall[5]
            if runtime != "onnx":  # latency: single calls as an application makes them
                for mode in modes:
                    for q in questions[:5]:
                        hg.retrieve(q["question"], k=5, mode=mode)
                    times = []
                    for q in questions:
                        t0 = time.perf_counter()
                        hg.retrieve(q["question"], k=5, mode=mode)
                        times.append(1000 * (time.perf_counter() - t0))
                    row[f"{mode} p50 ms"] = round(statistics.median(times), 2)
                    if runtime == "auto":  # recall with every question embedded as a small call
                        used = "traced" if emb._traced else "onnx" if emb._onnx else "torch"
                        gold = [q for q in questions if q.get("gold_idx")]
                        docs = [distinct_docs(hg.retrieve(q["question"], k=15, mode=mode))[:5]
                                for q in gold]  # as evaluate(): 3 x the deepest cutoff
                        for k in (2, 5):
                            row[f"{mode} R@{k} ({used}, single calls)"] = round(100 * statistics.mean(
                                recall_at(q["gold_idx"], d, k) for q, d in zip(gold, docs, strict=True)), 2)
            rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", required=True, type=Path, help="texts for part 1")
    parser.add_argument("--index", action="append", default=[], metavar="DB=BUNDLE",
                        help="an index and the bundle it was built from (part 2; repeatable)")
    parser.add_argument("--modes", default="dense,graph,hybrid")
    parser.add_argument("--batch", type=int, default=256, help="passages per throughput call")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the interleaved questions")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = {"cpus": os.cpu_count(), "model": model_rows(args.bundle, args.batch),
           "questions": question_rows(args.bundle, args.rounds), "retrieval": []}
    modes = [m for m in args.modes.split(",") if m]
    for spec in args.index:
        db, _, bundle = spec.partition("=")
        out["retrieval"].extend(retrieval_rows(Path(db), Path(bundle), modes))
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{out['cpus']} CPUs; texts from {args.bundle.name}")
    keys = ["embedder", "runs_on", "precision", "probe_agreement", "min_cos", "mean_cos",
            "question_p50_ms", "question_p95_ms", "passages_per_s"]
    print(" | ".join(keys))
    for r in out["model"]:
        extra = f"  (refused export: min cos {r['refused_min_cos']}, mean {r['refused_mean_cos']})" \
            if "refused_min_cos" in r else ""
        print(" | ".join(str(r.get(k)) for k in keys) + extra)
    print(f"one question, interleaved over {args.rounds} rounds:")
    for r in out["questions"]:
        print(", ".join(f"{k} {v}" for k, v in r.items()))
    for r in out["retrieval"]:
        print(", ".join(f"{k} {v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
