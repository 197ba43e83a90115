"""What one remembered session costs the writer while reads are coming (a server's case).

    python benchmarks/write_latency.py --db indexes/musique [--sessions 16] [--rounds 2] [--compare views|saves]

On fresh copies of the index, one handle answers a retrieval before each write (so the write
builds the next read view, as in ``hipgraph serve``) and adds one 4-turn session
(``add_conversation``, the sessions of ``benchmarks/serve_load.py``). Two settings, alternated
``--rounds`` times in the same run so the machine's drift falls on both:

- ``--compare views`` (default): the next read view derived from the previous one and the ids
  the write touched (``hipgraph/query/view_delta.py``, the default) against re-read whole from
  DuckDB (the derivation switched off in this process), both with the server's FAISS saves
  (at most every 5 s);
- ``--compare saves``: FAISS files saved at the end of every write (the library's default)
  against at most every 5 s (``save_vectors_every(5)``, the server's setting).

Printed per setting (medians over the rounds' sessions, the first two of each round left out as
warm-up): the write's wall time, the CPU time of the writing thread (extraction runs on a worker
thread and is not in it), and the part spent building the next read view before the commit.
An index built by ``benchmarks/scale.py --synthetic`` (pattern extractor, hashing embedder) is
opened with that extractor registered.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_load import session  # noqa: E402

import hipgraph  # noqa: E402
from hipgraph import registry  # noqa: E402
from hipgraph.query import view as view_module  # noqa: E402
from hipgraph.query import view_delta  # noqa: E402

# indexes of benchmarks/scale.py --synthetic name its pattern extractor
registry.register("extractor", "pattern", "scale:PatternExtractor")

QUESTIONS = ["Who founded the company that made the iPhone?", "What did Ana plant in the garden?"]


def one_round(db: Path, sessions: int, save_every: float, derive: bool = True) -> dict[str, list[float]]:
    view_module.derived_parts = view_delta.derived_parts if derive else (lambda *_: {})
    with hipgraph.open(db) as hg:
        hg.save_vectors_every(save_every)
        hg.retrieve_many(QUESTIONS, k=5)
        hg.add_conversation(session(1, 0)["conversation"])  # the extractor loads
        store = hg.store
        prepare, view_ms = store._prepare_publishers, []

        def timed_prepare(*args):
            t0 = time.perf_counter()
            try:
                return prepare(*args)
            finally:
                view_ms.append(1000 * (time.perf_counter() - t0))

        store._prepare_publishers = timed_prepare
        wall, cpu = [], []
        for n in range(sessions):
            hg.retrieve(QUESTIONS[n % 2], k=5)  # reads are recent: the write warms the next view
            t0, c0 = time.perf_counter(), time.thread_time()
            hg.add_conversation(session(0, n)["conversation"])
            wall.append(1000 * (time.perf_counter() - t0))
            cpu.append(1000 * (time.thread_time() - c0))
    return {"wall_ms": wall[2:], "cpu_ms": cpu[2:], "next_view_ms": view_ms[2:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", required=True, type=Path)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--compare", choices=("views", "saves"), default="views")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.compare == "views":
        settings = {"view re-read whole": (5.0, False), "view derived": (5.0, True)}
    else:
        settings = {"save at every write": (0.0, True), "save every 5 s": (5.0, True)}
    got: dict[str, dict[str, list[float]]] = {name: {} for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (name, (every, derive)) in enumerate(settings.items()):
                copy = Path(tmp) / f"r{r}-{i}"
                shutil.copytree(args.db, copy, ignore=shutil.ignore_patterns("*.lock"))
                for key, values in one_round(copy, args.sessions, every, derive).items():
                    got[name].setdefault(key, []).extend(values)
                shutil.rmtree(copy)
    out = {name: {key: round(statistics.median(v), 1) for key, v in parts.items()} for name, parts in got.items()}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"index {args.db} (copies), {os.cpu_count()} CPUs, {args.rounds} rounds x {args.sessions} sessions")
    print(f"{'setting':22s} {'wall p50 ms':>12s} {'writer cpu ms':>14s} {'next view ms':>13s}")
    for name, row in out.items():
        print(f"{name:22s} {row['wall_ms']:12.1f} {row['cpu_ms']:14.1f} {row['next_view_ms']:13.1f}")
    a, b = out.values()
    print(f"{'ratio (second / first)':22s} {b['wall_ms'] / a['wall_ms']:12.2f} {b['cpu_ms'] / a['cpu_ms']:14.2f} "
          f"{b['next_view_ms'] / a['next_view_ms']:13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
