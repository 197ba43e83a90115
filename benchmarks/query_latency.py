"""Query latency per retrieval mode: p50/p95 of single ``retrieve`` calls and ``retrieve_many``
throughput, on an existing index (e.g. the musique bundle indexed with ``hipgraph eval``).

    python benchmarks/query_latency.py --db indexes/musique \\
        --bundle ../shared/data/multihop/musique_train100.json [--modes graph,dense,bm25,hybrid,decompose,expand]

Every mode is warmed up first (model load, numba compilation, snapshot/BM25 cache), so the figures
are steady-state query costs. Reference: HippoRAG 2 reports about 1.2 s per query (with its LLM
filter); targets here are graph p50 <= 30 ms and dense p50 <= 10 ms on CPU without the LLM filter,
and decompose (offline) p50 <= 4x graph's, printed as the ``x graph`` ratio measured in the same run.

``--threads 1,2,4,8`` adds, after that table, one row per mode and thread count: N threads share
the one handle and call ``retrieve`` on the ``--queries`` questions (each once), giving throughput
(calls that returned per second of wall time), p50/p95 latency of those calls, the calls that raised (counted, and the
first message of each exception type printed below the table) and the calls whose passages differ
from the single-thread call's ("wrong"). Any error or wrong ranking makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hipgraph  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    pos = (len(values) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def bundle_questions(path: Path, conversation: str) -> list[str]:
    """The questions of a QA bundle, or of a LoCoMo file's conversation named ``conversation``
    (the index folder's name, as ``hipgraph eval --format locomo`` names them; all when none is)."""
    data = json.loads(path.read_text())
    if "questions" in data:
        return [q["question"] for q in data["questions"]]
    convs = data["conversations"]
    chosen = [c for c in convs if c.get("id") == conversation] or convs
    return [q["question"] for c in chosen for q in c.get("questions", [])]


def threaded_run(hg, questions: list[str], mode: str, k: int, threads: int,
                 expected: dict[str, list[int]]) -> dict:
    """``threads`` threads share ``hg`` and retrieve ``questions`` (each once, taken in order from a
    shared cursor): throughput, latency of the calls that returned, errors by type, and the calls
    whose passages (and turns) differ from ``expected`` (the single-thread ranking of that question)."""
    lock = threading.Lock()
    cursor = iter(questions)
    times: list[float] = []
    errors: Counter[str] = Counter()
    first_error: dict[str, str] = {}
    wrong = [0]
    start = threading.Barrier(threads + 1)

    def work() -> None:
        start.wait()
        while True:
            with lock:
                q = next(cursor, None)
            if q is None:
                return
            t0 = time.perf_counter()
            try:
                hits = hg.retrieve(q, k=k, mode=mode)
            except Exception as exc:  # noqa: BLE001 - counted and printed, never hidden
                with lock:
                    errors[type(exc).__name__] += 1
                    first_error.setdefault(type(exc).__name__, str(exc).splitlines()[0][:300])
                continue
            ms = 1000 * (time.perf_counter() - t0)
            with lock:
                times.append(ms)
                if [(h.passage_id, h.turn_ids) for h in hits] != expected.get(q):
                    wrong[0] += 1

    pool = [threading.Thread(target=work, name=f"query-{i}") for i in range(threads)]
    for t in pool:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    wall = time.perf_counter() - t0
    return {"mode": mode, "threads": threads, "queries": len(questions), "ok": len(times),
            "qps": round(len(times) / wall, 1) if wall > 0 else 0.0,
            "p50_ms": round(percentile(times, 0.5), 2) if times else None,
            "p95_ms": round(percentile(times, 0.95), 2) if times else None,
            "errors": sum(errors.values()), "error_types": dict(errors), "first_error": first_error,
            "wrong": wrong[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", required=True)
    parser.add_argument("--bundle", required=True, help="bundle JSON whose questions are the queries")
    parser.add_argument("--modes", default="graph,dense,bm25,hybrid,decompose,expand")
    parser.add_argument("-k", type=int, default=5)
    parser.add_argument("--queries", type=int, default=100, help="questions timed one by one")
    parser.add_argument("--batch", type=int, default=64, help="retrieve_many batch size")
    parser.add_argument("--threads", default="",
                        help="comma-separated thread counts (e.g. 1,2,4,8): also time N threads "
                             "sharing one handle")
    parser.add_argument("--memory-hits", choices=("turn", "unit"), default="turn",
                        help="conversation memory: turn hits (the default) or unit hits")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    thread_counts = [int(n) for n in args.threads.split(",") if n.strip()]
    if any(n < 1 for n in thread_counts):
        parser.error("--threads takes counts >= 1")

    questions = bundle_questions(Path(args.bundle), Path(args.db).name)
    questions = (questions * (1 + args.queries // max(1, len(questions))))[: args.queries]
    modes = [m for m in args.modes.split(",") if m]
    rows = []
    threaded = []
    expected: dict[str, dict[str, list[int]]] = {}  # mode -> question -> single-thread passage ids
    config = hipgraph.RetrievalConfig(memory_hits=args.memory_hits)
    with hipgraph.open(args.db, read_only=True, retrieval=config) as hg:
        for mode in modes:
            hg.retrieve_many(questions[:8], k=args.k, mode=mode)  # warm-up
            times = []
            for q in questions:
                t0 = time.perf_counter()
                hits = hg.retrieve(q, k=args.k, mode=mode)
                times.append(1000 * (time.perf_counter() - t0))
                expected.setdefault(mode, {})[q] = [(h.passage_id, h.turn_ids) for h in hits]
            t0 = time.perf_counter()
            done = 0
            for start in range(0, len(questions), args.batch):
                batch = questions[start:start + args.batch]
                tb = time.perf_counter()
                hg.retrieve_many(batch, k=args.k, mode=mode)
                done += len(batch)
                if os.environ.get("HIPGRAPH_BENCH_DEBUG"):
                    print(mode, len(batch), round(time.perf_counter() - tb, 3), file=sys.stderr)
            batch_s = time.perf_counter() - t0
            rows.append({"mode": mode, "p50_ms": round(percentile(times, 0.5), 2),
                         "p95_ms": round(percentile(times, 0.95), 2),
                         "mean_ms": round(statistics.fmean(times), 2),
                         "batch_qps": round(done / batch_s, 1),
                         "batch_ms_per_query": round(1000 * batch_s / done, 2)})
        for mode in modes:
            for n in thread_counts:
                threaded.append(threaded_run(hg, questions, mode, args.k, n, expected[mode]))
    out = {"db": args.db, "queries": len(questions), "k": args.k, "batch": args.batch,
           "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2), "modes": rows}
    graph = next((r for r in rows if r["mode"] == "graph"), None)
    if graph is not None and graph["p50_ms"] > 0:
        for r in rows:
            r["p50_vs_graph"] = round(r["p50_ms"] / graph["p50_ms"], 2)
    failed = any(r["errors"] or r["wrong"] for r in threaded)
    if thread_counts:
        out["threaded"] = threaded
    if args.json:
        print(json.dumps(out, indent=2))
        return 1 if failed else 0
    print(f"index {args.db}: {len(questions)} queries, k={args.k}, {os.cpu_count()} CPUs, "
          f"load {out['load_avg_1m']}")
    print(f"{'mode':9s} {'p50 ms':>8s} {'p95 ms':>8s} {'mean ms':>8s} {'batch q/s':>10s} "
          f"{'batch ms/q':>11s} {'x graph':>8s}")
    for r in rows:
        ratio = f"{r['p50_vs_graph']:8.2f}" if "p50_vs_graph" in r else f"{'':8s}"
        print(f"{r['mode']:9s} {r['p50_ms']:8.2f} {r['p95_ms']:8.2f} {r['mean_ms']:8.2f} "
              f"{r['batch_qps']:10.1f} {r['batch_ms_per_query']:11.2f} {ratio}")
    if thread_counts:
        print_threaded(threaded, len(questions))
    return 1 if failed else 0


def print_threaded(rows: list[dict], queries: int) -> None:
    """The threaded rows as a table, then the first message of each exception type."""
    def ms(value: float | None) -> str:
        return f"{value:8.2f}" if value is not None else f"{'-':>8s}"

    print(f"\nthreads sharing one handle, {queries} retrieve calls per row (each question once)")
    print(f"{'mode':9s} {'threads':>7s} {'q/s':>8s} {'p50 ms':>8s} {'p95 ms':>8s} {'errors':>7s} "
          f"{'wrong':>6s}")
    for r in rows:
        print(f"{r['mode']:9s} {r['threads']:7d} {r['qps']:8.1f} {ms(r['p50_ms'])} {ms(r['p95_ms'])} "
              f"{r['errors']:7d} {r['wrong']:6d}")
    failing = [r for r in rows if r["errors"]]
    if failing:
        print("\nerrors (first message of each type):")
        for r in failing:
            for kind, n in sorted(r["error_types"].items(), key=lambda kv: -kv[1]):
                print(f"  {r['mode']} x{r['threads']}: {n} x {kind}: {r['first_error'][kind]}")
    wrong = sum(r["wrong"] for r in rows)
    if wrong:
        print(f"\n{wrong} calls returned other passages than the single-thread call of the same question")


if __name__ == "__main__":
    sys.exit(main())
