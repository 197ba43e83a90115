"""Where a growing build's time goes: per-step timers over a synthetic build (scale.py's corpus).

    python benchmarks/build_steps.py [--size 100000] [--batch-size N] [--out /tmp/hipgraph-steps] [--keep]
                                     [--workers N]

Builds one index of ``scale.py --synthetic`` (pattern extractor, hashing embedder) in this process
with timers around the write path's steps (SQL routines of ``indexers/graph_update.py``, the
indexer's lookups, DuckDB inserts, the FAISS update after each commit) and prints, per step, its
total, its calls, and its mean per call over the first and the last quarter of the calls: a step
whose last-quarter mean is well above its first-quarter mean grows with the index (a batch costs
more as the index gets larger), which is what makes a build superlinear. Timers are wall time
on the writing thread, which shares the cores (and the GIL) with extraction and embedding of the
next batch, so compare steps within a run. ``--workers N`` extracts and embeds in N worker
processes instead (the writing thread then has this process's GIL to itself). The CPU time used
and the time the hypervisor stole meanwhile are printed too: on a VM a build's wall time drifts
with the steal, so compare runs on both.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import resource
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import scale  # noqa: E402

import hipgraph  # noqa: E402
from hipgraph import registry  # noqa: E402
from hipgraph.config import EmbedderConfig, ExtractorConfig, IndexConfig  # noqa: E402
from hipgraph.indexers import graph_update, pipeline  # noqa: E402
from hipgraph.store import database, vector_set, vectors  # noqa: E402

# at module level, so that spawned worker processes (--workers) know the extractor too
registry.register("extractor", "pattern", "scale:PatternExtractor")
TIMES: dict[str, list[float]] = collections.defaultdict(list)
GRAPH_STEPS = ("insert_mentions", "refresh_surface_forms", "refresh_entities", "add_fact_edge_counts", "fold_fact_edges",
               "add_mention_edges",
               "update_synonyms", "collect_orphans", "delete_document_rows")
STEPS = [
    (graph_update, GRAPH_STEPS),
    (pipeline, GRAPH_STEPS),  # the names the pipeline imported (each call is timed once, here)
    (pipeline.Indexer, ("_existing", "_resolve_existing", "_write")),
    (vector_set.VectorSet, ("apply", "_rebuild")),  # _rebuild: (re)training an IVF layout
    (vectors.FaissVectorIndex, ("range_search", "_ivf_range_search")),  # synonym candidates
    (database.GraphStore, ("insert", "write_vectors", "allocate_id_blocks", "bump_generation",
                           "_checkpoint_if_due")),
]


def timed(owner, name: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TIMES[name].append(time.perf_counter() - t0)

    setattr(owner, name, wrapper)


def steal_seconds() -> float | None:
    """CPU time the hypervisor gave to others so far, summed over this machine's CPUs (``steal`` in
    /proc/stat; None where there is no such file). A build's wall time drifts with it on a VM."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def cpu_seconds() -> float:
    """User and system CPU time of this process and its finished children (worker processes)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="fixed batches of this many documents (default: the index's batches, "
                             "256 growing with the index to at most 4096)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/hipgraph-steps"))
    parser.add_argument("--keep", action="store_true", help="leave the built index at --out")
    parser.add_argument("--workers", type=int, default=None,
                        help="extract and embed in this many worker processes (default: threads here)")
    args = parser.parse_args()
    for owner, names in STEPS:
        for name in names:
            timed(owner, name)
    docs, _ = scale.synthetic_corpus(args.size)
    config = IndexConfig(extractor=ExtractorConfig(name="pattern"), embedder=EmbedderConfig(name="hashing"))
    shutil.rmtree(args.out, ignore_errors=True)
    steal0, cpu0 = steal_seconds(), cpu_seconds()
    t0 = time.perf_counter()
    with hipgraph.open(args.out, create=True, config=config) as hg:
        report = hg.add_documents(docs, batch_size=args.batch_size, workers=args.workers)
    batches = f"batches of {args.batch_size}" if args.batch_size else "growing batches"
    print(f"{args.size} passages (synthetic vectors and extractions), {batches} ({len(TIMES['_write'])}): "
          f"build {time.perf_counter() - t0:.1f} s; stages {({k: round(v, 1) for k, v in report.seconds.items()})}; "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    steal1 = steal_seconds()
    stolen = f"{steal1 - steal0:.1f} s" if steal0 is not None and steal1 is not None else "unknown"
    print(f"CPU {cpu_seconds() - cpu0:.1f} s (this process and its workers, user + system); "
          f"stolen by the hypervisor meanwhile {stolen} (all CPUs)")
    print(f"{'step':24s} {'total s':>8s} {'calls':>6s} {'first-quarter ms':>17s} {'last-quarter ms':>16s}")
    for name, values in sorted(TIMES.items(), key=lambda kv: -sum(kv[1])):
        q = max(1, len(values) // 4)
        print(f"{name:24s} {sum(values):8.2f} {len(values):6d} {1000 * sum(values[:q]) / q:17.1f} "
              f"{1000 * sum(values[-q:]) / q:16.1f}")
    if not args.keep:
        shutil.rmtree(args.out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
