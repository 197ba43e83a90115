"""How an index grows: build time, disk, peak memory and query latency at increasing sizes.

    python benchmarks/scale.py --sizes 10000,100000 [--workers 2]          # synthetic text, real models
    python benchmarks/scale.py --sizes 10000,100000,1000000 --synthetic    # synthetic vectors + extractions
    python benchmarks/scale.py --sizes 10000,100000,1000000 --synthetic --bracket  # smaller sizes again after

Each size gets a fresh index of a synthetic corpus (deterministic: made-up people, companies and
places in short factual sentences), built through the normal pipeline from a stream of documents.

- default (``text``): the real extractor (spaCy) and embedder (MiniLM) read the synthetic text;
- ``--synthetic``: labelled "synthetic vectors and extractions" - the same text, read by a pattern
  extractor that recovers each sentence's (subject, relation, object) and the model-free
  ``hashing`` embedder; every other step (ids, DuckDB writes, synonym kNN, FAISS layouts, the PPR
  snapshot, querying) is the real one. This is what makes a million passages buildable on 2 cores.

Printed per size: build seconds and passages/s, disk bytes per passage, peak RSS of the process
(a child per size, so sizes do not share memory; building and querying), the FAISS layouts chosen,
dense and graph query p50 over questions about the corpus's facts, and the growth ratios between
consecutive sizes (linear growth: ratios close to the size ratio), in wall time and in the CPU time
the build used (its process and any worker processes).

A VM's speed drifts over the minutes a large size takes, and a ratio then compares a fast moment
with a slow one. ``--bracket`` builds every size below the largest a second time after it (in
descending order), so each smaller size is measured once before and once after the larger ones;
the ratios are then taken between the means of each size's builds, and each build is listed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_SYLLABLES = ["ka", "lo", "mir", "ten", "vas", "rud", "el", "no", "sha", "bri", "tor", "quin", "dal", "fe",
              "gor", "iss", "ma", "pel", "rho", "sta", "ul", "ven", "wyn", "zar"]
_RELATIONS = [("founded", "company"), ("works for", "company"), ("was born in", "place"),
              ("lives in", "place"), ("married", "person"), ("studied at", "company"),
              ("moved to", "place"), ("met", "person")]


def _name(rng: random.Random, parts: int) -> str:
    return " ".join("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
                    for _ in range(parts))


def synthetic_corpus(n: int, seed: int = 7) -> tuple[Iterator[dict], list[str]]:
    """``n`` documents (streamed) and questions about their facts."""
    rng = random.Random(seed)
    people = [_name(rng, 2) for _ in range(max(50, n // 4))]
    companies = [_name(rng, 1) + " " + rng.choice(["Industries", "Labs", "Group", "Bank"]) for _ in range(max(20, n // 20))]
    places = [_name(rng, 1) + rng.choice(["ville", "burg", " City", "ton"]) for _ in range(max(20, n // 40))]
    pools = {"person": people, "company": companies, "place": places}
    questions: list[str] = []

    def docs() -> Iterator[dict]:
        r = random.Random(seed + 1)
        for i in range(n):
            who = people[i % len(people)]
            sentences = []
            for _ in range(r.randint(3, 5)):
                rel, kind = r.choice(_RELATIONS)
                obj = r.choice(pools[kind])
                sentences.append(f"{who} {rel} {obj} in {r.randint(1950, 2023)}.")
                if len(questions) < 500 and r.random() < 0.1:
                    questions.append(f"Who {rel} {obj}?")
            yield {"id": f"d{i}", "title": who, "text": " ".join(sentences)}

    return docs(), questions


_SENTENCE = re.compile(r"([A-Z][\w ]*?) (" + "|".join(r for r, _ in _RELATIONS) + r") ([A-Z][\w ]*?) in (\d{4})\.")
_LABEL = {"person": "PERSON", "company": "ORG", "place": "GPE"}


class PatternExtractor:
    """Synthetic extractions: each sentence's (subject, relation, object) and year, read back by a
    pattern (the corpus is generated from these facts, so nothing is guessed)."""

    name = "pattern:synthetic"

    def __init__(self, config=None):
        self.kinds = dict(_RELATIONS)

    def extract(self, chunks):
        from hipgraph.types import Extraction, Triple  # noqa: PLC0415

        out = []
        for chunk in chunks:
            entities, labels, triples = {}, {}, []
            for subj, rel, obj, year in _SENTENCE.findall(chunk.text):
                entities.update(dict.fromkeys((subj, obj, year)))
                labels.update({subj: "PERSON", obj: _LABEL[self.kinds[rel]], year: "DATE"})
                triples.append(Triple(subj, rel, obj))
            out.append(Extraction(tuple(entities), tuple(triples), labels))
        return out


def cpu_seconds() -> float:
    """User and system CPU time of this process and of its waited-for children (worker processes)."""
    import resource  # noqa: PLC0415

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def by_size(rows: list[dict]) -> list[dict]:
    """One row per size, in ascending order: the mean of that size's builds (wall, CPU, until
    closed) with the other figures of its last run."""
    out = []
    for size in sorted({r["size"] for r in rows}):
        runs = [r for r in rows if r["size"] == size]
        mean = dict(runs[-1])
        for key in ("build_s", "build_cpu_s", "closed_s"):
            values = [r[key] for r in runs if key in r]
            if values:
                mean[key] = statistics.fmean(values)
        mean["runs"] = len(runs)
        out.append(mean)
    return out


def build_and_query(size: int, root: Path, n_queries: int, synthetic: bool, workers: int | None,
                    batch_size: int | None = None, query_only: bool = False) -> dict:
    """One size, in this process (called in a child per size). With ``query_only``, the index
    built by an earlier run is reopened and only queried (its build figures are read back)."""
    import resource  # noqa: PLC0415

    import hipgraph  # noqa: PLC0415
    from hipgraph import registry  # noqa: PLC0415
    from hipgraph.config import EmbedderConfig, ExtractorConfig, IndexConfig  # noqa: PLC0415

    def rss_mb() -> float:
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

    path = root / f"n{size}{'-synthetic' if synthetic else ''}"
    record = root / f"{path.name}.build.json"
    docs, questions = synthetic_corpus(size)
    config = None
    if synthetic:
        registry.register("extractor", "pattern", "__main__:PatternExtractor")
        config = IndexConfig(extractor=ExtractorConfig(name="pattern"), embedder=EmbedderConfig(name="hashing"))
    if query_only:
        for _ in docs:  # the questions are drawn while the corpus streams
            pass
        out = json.loads(record.read_text())
    else:
        shutil.rmtree(path, ignore_errors=True)
        t0, cpu0 = time.perf_counter(), cpu_seconds()
        with hipgraph.open(path, create=True, config=config) as hg:
            report = hg.add_documents(docs, workers=workers, batch_size=batch_size)
            build = time.perf_counter() - t0
            build_cpu = cpu_seconds() - cpu0
            stats = dict(hg.stats())
            out = {"size": size, "mode": "synthetic vectors+extractions" if synthetic else "synthetic text",
                   "batch_size": batch_size or hg.config.batch_size, "workers": workers or 0,
                   "build_s": round(build, 1), "build_cpu_s": round(build_cpu, 1), "passages": stats["passages"],
                   "entities": stats["entities"], "facts": stats["facts"],
                   "stages_s": {k: round(v, 1) for k, v in report.seconds.items()},
                   "layouts": {k: v.layout for k, v in hg.vectors.indexes.items()},
                   "build_peak_rss_mb": rss_mb()}
        # until closed: the final checkpoint and FAISS save are part of a build a user waits for
        # (a small build defers all its checkpoint work to here, a large one pays some in between)
        out["closed_s"] = round(time.perf_counter() - t0, 1)
        out["disk_mb"] = round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20, 1)
        record.write_text(json.dumps(out))
    with hipgraph.open(path) as hg:  # reopened: queries as a user's later session runs them
        qs = questions[:n_queries]
        for mode in ("dense", "graph"):
            hg.retrieve_many(qs[:4], k=5, mode=mode)  # warm-up (and the graph snapshot)
            times = []
            for q in qs:
                t = time.perf_counter()
                hg.retrieve(q, k=5, mode=mode)
                times.append(1000 * (time.perf_counter() - t))
            out[f"{mode}_p50_ms"] = round(statistics.median(times), 2)
    out["peak_rss_mb"] = rss_mb()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2000,10000")
    parser.add_argument("--out", type=Path, default=Path("/tmp/hipgraph-scale"))
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--synthetic", action="store_true", help="synthetic vectors and extractions (labelled)")
    parser.add_argument("--workers", type=int, default=None, help="local worker processes for the build")
    parser.add_argument("--batch-size", type=int, default=None, help="documents per committed batch (256)")
    parser.add_argument("--query-only", action="store_true", help="query the indexes of an earlier run again")
    parser.add_argument("--bracket", action="store_true",
                        help="build the sizes below the largest again after it (descending); ratios of the means")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(build_and_query(args.one, args.out, args.queries, args.synthetic, args.workers,
                                         args.batch_size, args.query_only)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    sizes = sorted({int(s) for s in args.sizes.split(",") if s})
    if args.bracket and not args.query_only:
        sizes += sorted(sizes[:-1], reverse=True)
    for size in sizes:
        extra = ((["--synthetic"] if args.synthetic else []) + (["--workers", str(args.workers)] if args.workers else [])
                 + (["--batch-size", str(args.batch_size)] if args.batch_size else [])
                 + (["--query-only"] if args.query_only else []))
        proc = subprocess.run([sys.executable, __file__, "--one", str(size), "--out", str(args.out),
                               "--queries", str(args.queries), *extra], capture_output=True, text=True, check=True)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), file=sys.stderr)
    nan = float("nan")  # records of earlier runs may lack a figure
    print(f"mode: {rows[0]['mode'] if rows else '-'}; peak RSS: of the build, and of the whole process "
          f"({'querying only' if args.query_only else 'build and queries'})")
    print("build s: adding the documents; closed s: until the index is closed (final checkpoint and save)")
    if len(rows) > len({r["size"] for r in rows}):
        print("builds in the order run (wall s / CPU s): " + ", ".join(
            f"{r['size']}: {r['build_s']:.1f} / {r.get('build_cpu_s', nan):.1f}" for r in rows))
        print("below: the mean of each size's builds")
    rows = by_size(rows)
    print(f"{'passages':>9s} {'build s':>8s} {'CPU s':>7s} {'closed s':>9s} {'pass/s':>7s} {'disk MB':>8s} "
          f"{'B/passage':>10s} "
          f"{'build RSS MB':>13s} {'peak RSS MB':>12s} {'dense p50':>10s} {'graph p50':>10s}")
    for r in rows:
        closed = r.get("closed_s", nan)
        print(f"{r['passages']:9d} {r['build_s']:8.1f} {r.get('build_cpu_s', nan):7.1f} {closed:9.1f} "
              f"{r['passages'] / r['build_s']:7.1f} {r['disk_mb']:8.1f} "
              f"{r['disk_mb'] * 2**20 / r['passages']:10.0f} {r.get('build_peak_rss_mb', nan):13.1f} "
              f"{r['peak_rss_mb']:12.1f} {r['dense_p50_ms']:10.2f} {r['graph_p50_ms']:10.2f}")
    for a, b in zip(rows, rows[1:], strict=False):
        print(f"{a['passages']} -> {b['passages']} passages (x{b['passages'] / a['passages']:.1f}): build "
              f"x{b['build_s'] / a['build_s']:.2f} (CPU x{b.get('build_cpu_s', nan) / a.get('build_cpu_s', nan):.2f}, "
              f"until closed x{b.get('closed_s', nan) / a.get('closed_s', nan):.2f}), disk x{b['disk_mb'] / a['disk_mb']:.2f}, "
              f"graph p50 x{b['graph_p50_ms'] / a['graph_p50_ms']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
