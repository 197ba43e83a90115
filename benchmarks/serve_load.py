"""Load on ``hipgraph serve``: R concurrent readers alone and beside one writer, then with ``kill -9``.

    python benchmarks/serve_load.py --db indexes/musique \\
        --bundle ../shared/data/multihop/musique_train100.json [--readers 1,4,16] [--seconds 60] \\
        [--write-every SECONDS]

Every run starts from a fresh copy of the index (the writer adds to it, and conversation memory
makes retrieval take the memory path). For each R, a server is started on a free
loopback port (once with readers only, once beside the writer); R threads call ``POST /v1/retrieve`` (graph mode, k=5, the bundle's questions in
turn) and one thread adds conversation sessions (``POST /v1/conversations``, one 4-turn session
each) for ``--seconds``: as fast as it is answered, or with ``--write-every`` one session every
that many seconds (both writers, the server's and the in-process reference's, keep the same pace,
so that "same load" means the same writes). Printed per run: reads/s, p50/p95/p99 of the reads, failed requests
(any status but 200, or a transport error), acknowledged writes, and the acknowledged writes
missing afterwards (each session looked up with ``GET /v1/documents/{id}``). The ``kill -9`` run
kills the server halfway, starts it again and carries on (requests refused while it is down are
counted as ``down``, not as failures; failures are requests the running server answered wrongly).
Reference, measured in the same run on the same copy: in-process ``retrieve`` p50 (one question
a call) and ``retrieve_many`` throughput (batches of 64), alone and beside an in-process writer
adding the same sessions for ``--seconds`` (the server's runs beside its writer are also printed
against that one, ``x same``: the server's own cost under the same writes). Targets: zero failures and zero lost
writes in every run; one reader: server p50 <= in-process p50 + 5 ms (also measured with the
server's and in-process calls interleaved, which cancels the machine's drift between runs); 16 readers on 2 cores:
reads/s >= 0.8 x in-process ``retrieve_many`` throughput. The CPU the server process and this
load-generating process (its HTTP clients) used, in cores, is printed beside each run: on a small
machine the clients take part of what the server could have had.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

import hipgraph  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    pos = (len(values) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, db: Path):
        self.db, self.port = db, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "hipgraph", "serve", "--db", str(self.db),
                                      "--port", str(self.port)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited {self.proc.returncode}: {self.proc.stderr.read()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise SystemExit("server did not come up")

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the running server process has used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(120)


def in_process(db: Path, questions: list[str]) -> dict:
    with hipgraph.open(db, read_only=True) as hg:
        hg.retrieve_many(questions[:8], k=5)
        times = []
        for q in questions:
            t0 = time.perf_counter()
            hg.retrieve(q, k=5)
            times.append(1000 * (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for start in range(0, len(questions), 64):
            hg.retrieve_many(questions[start:start + 64], k=5)
        qps = len(questions) / (time.perf_counter() - t0)
    return {"p50_ms": round(statistics.median(times), 2), "retrieve_many_qps": round(qps, 1)}


def one_client_interleaved(server_db: Path, local_db: Path, questions: list[str], rounds: int = 6) -> dict:
    """One client against the server and in-process calls on a second copy, alternating blocks of
    questions, so both see the same machine load: p50 of each and the median per-question delta."""
    server = Server(server_db)
    server.start()
    served, local = [], []
    try:
        with httpx.Client(timeout=60) as c, hipgraph.open(local_db, read_only=True) as hg:
            for q in questions[:10]:
                c.post(f"{server.url}/v1/retrieve", json={"question": q, "k": 5})
                hg.retrieve(q, k=5)
            block = max(1, len(questions) // rounds)
            for r in range(rounds):
                chunk = questions[r * block:(r + 1) * block]
                for q in chunk:
                    t0 = time.perf_counter()
                    c.post(f"{server.url}/v1/retrieve", json={"question": q, "k": 5}).raise_for_status()
                    served.append(1000 * (time.perf_counter() - t0))
                for q in chunk:
                    t0 = time.perf_counter()
                    hg.retrieve(q, k=5)
                    local.append(1000 * (time.perf_counter() - t0))
    finally:
        server.stop()
    return {"server_p50_ms": round(statistics.median(served), 2),
            "in_process_p50_ms": round(statistics.median(local), 2),
            "median_delta_ms": round(statistics.median(a - b for a, b in zip(served, local, strict=True)), 2)}


def paced(every: float, stop: threading.Event) -> Iterator[int]:
    """Session numbers 0, 1, ...: at once one after another (``every`` 0), or the n-th no earlier
    than ``n * every`` seconds after the start (a writer that falls behind catches up at once)."""
    t0, n = time.perf_counter(), 0
    while not stop.is_set():
        if every > 0 and stop.wait(max(0.0, t0 + n * every - time.perf_counter())):
            return
        yield n
        n += 1


def in_process_beside_writer(db: Path, questions: list[str], seconds: float, every: float = 0.0) -> dict:
    """The same load without the server: ``retrieve_many`` in batches of 64 on one thread while
    another adds the writer's sessions (``add_conversation``, paced as the server's writer) to the
    same handle."""
    stop = threading.Event()
    acked = [0]
    with hipgraph.open(db) as hg:
        hg.retrieve_many(questions[:8], k=5)
        hg.add_conversation(session(1, 0)["conversation"])  # the writer's models load first

        def writer() -> None:
            for n in paced(every, stop):
                hg.add_conversation(session(0, n)["conversation"])
                acked[0] += 1

        thread = threading.Thread(target=writer)
        thread.start()
        answered, start, t0 = 0, 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            batch = [questions[(start + i) % len(questions)] for i in range(64)]
            hg.retrieve_many(batch, k=5)
            answered += len(batch)
            start += 64
        wall = time.perf_counter() - t0
        stop.set()
        thread.join()
    return {"retrieve_many_qps": round(answered / wall, 1), "acked_writes": acked[0], "seconds": round(wall, 1)}


def session(writer: int, n: int) -> dict:
    return {"conversation": {"id": f"load{writer}", "speakers": ["Ana", "Ben"], "sessions": [
        {"id": str(n), "time": f"2024-01-{1 + n % 28:02d} 10:{n % 60:02d}", "turns": [
            {"speaker": "Ana", "text": f"Note {n}: I planted {n % 7 + 1} tomato plants in the garden."},
            {"speaker": "Ben", "text": f"Did the bed by the fence get water on day {n}?"},
            {"speaker": "Ana", "text": f"Yes, and the basil next to it grew {n % 5 + 2} leaves."},
            {"speaker": "Ben", "text": "Good, the compost helps."}]}]}}


def run(db: Path, questions: list[str], readers: int, seconds: float, kill: bool,
        writing: bool = True, every: float = 0.0) -> dict:
    server = Server(db)
    server.start()
    lat: list[float] = []
    counts = {"reads": 0, "failed": 0, "down": 0, "acked": 0, "write_failed": 0}
    acked: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    up = threading.Event()
    up.set()

    def reader(i: int) -> None:
        with httpx.Client(timeout=120) as c:
            n = i
            while not stop.is_set():
                q = questions[n % len(questions)]
                n += readers
                t0 = time.perf_counter()
                try:
                    r = c.post(f"{server.url}/v1/retrieve", json={"question": q, "k": 5})
                except httpx.TransportError:
                    with lock:
                        counts["down" if not up.is_set() or kill else "failed"] += 1
                    up.wait(300)
                    continue
                ms = 1000 * (time.perf_counter() - t0)
                with lock:
                    if r.status_code == 200 and r.json()["hits"]:
                        counts["reads"] += 1
                        lat.append(ms)
                    else:
                        counts["failed"] += 1

    def writer() -> None:
        with httpx.Client(timeout=300) as c:
            for n in paced(every, stop):
                try:
                    r = c.post(f"{server.url}/v1/conversations", json=session(0, n))
                except httpx.TransportError:
                    with lock:
                        counts["down"] += 1
                    up.wait(300)
                    continue
                with lock:
                    if r.status_code == 200:
                        counts["acked"] += 1
                        acked.append(f"load0#{n}")
                    elif r.status_code == 503:
                        time.sleep(float(r.headers.get("retry-after", "1")))
                    else:
                        counts["write_failed"] += 1

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
    if writing:
        threads.append(threading.Thread(target=writer))
    t0 = time.perf_counter()
    client_cpu0, server_cpu0 = time.process_time(), server.cpu_seconds()
    for t in threads:
        t.start()
    if kill:
        time.sleep(seconds / 2)
        up.clear()
        server.stop(signal.SIGKILL)
        server.start()
        up.set()
        time.sleep(seconds / 2)
    else:
        time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    client_cores = (time.process_time() - client_cpu0) / wall
    server_cores = None if kill else (server.cpu_seconds() - server_cpu0) / wall
    with httpx.Client(base_url=server.url, timeout=60) as c:
        lost = [key for key in acked if c.get(f"/v1/documents/{quote(key, safe='')}").status_code != 200]
    exit_code = server.stop()
    return {"readers": readers, "writer": writing, "kill_9": kill, "seconds": round(wall, 1),
            "reads_per_s": round(counts["reads"] / wall, 1),
            "p50_ms": round(percentile(lat, 0.5), 2), "p95_ms": round(percentile(lat, 0.95), 2),
            "p99_ms": round(percentile(lat, 0.99), 2), "failed": counts["failed"] + counts["write_failed"],
            "refused_while_down": counts["down"], "acked_writes": counts["acked"], "lost_writes": len(lost),
            "client_cores": round(client_cores, 2),
            "server_cores": None if server_cores is None else round(server_cores, 2),
            "server_exit": exit_code}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", required=True, type=Path)
    parser.add_argument("--bundle", required=True, type=Path)
    parser.add_argument("--readers", default="1,4,16")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--write-every", type=float, default=0.0, metavar="SECONDS",
                        help="pace both writers (server and in-process): a session every SECONDS "
                             "(default 0: each as soon as the last was answered)")
    parser.add_argument("--no-kill", action="store_true", help="skip the kill -9 run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    questions = [q["question"] for q in json.loads(args.bundle.read_text())["questions"]]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        copies = iter(range(10**6))

        def fresh() -> Path:  # every run starts from the index as given (the writer grows it)
            copy = Path(tmp) / f"ix{next(copies)}"
            shutil.copytree(args.db, copy, ignore=shutil.ignore_patterns("*.lock"))
            return copy

        reference = in_process(fresh(), questions)
        reference["beside_writer"] = in_process_beside_writer(fresh(), questions, args.seconds, args.write_every)
        reference["one_client"] = one_client_interleaved(fresh(), fresh(), questions)
        for r in [int(x) for x in args.readers.split(",") if x.strip()]:
            rows.append(run(fresh(), questions, r, args.seconds, kill=False, writing=False))
            rows.append(run(fresh(), questions, r, args.seconds, kill=False, every=args.write_every))
        if not args.no_kill:
            rows.append(run(fresh(), questions, max(int(x) for x in args.readers.split(",")), args.seconds, kill=True,
                            every=args.write_every))
    out = {"db": str(args.db), "cpus": os.cpu_count(), "write_every_s": args.write_every, "in_process": reference, "runs": rows}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        beside = reference["beside_writer"]
        print(f"index {args.db} (copy), {os.cpu_count()} CPUs; in-process: retrieve p50 "
              f"{reference['p50_ms']} ms, retrieve_many {reference['retrieve_many_qps']} q/s; "
              f"retrieve_many beside an in-process writer {beside['retrieve_many_qps']} q/s "
              f"({beside['acked_writes']} sessions written in {beside['seconds']} s)")
        one = reference["one_client"]
        print(f"one client, interleaved with in-process calls: server p50 {one['server_p50_ms']} ms, "
              f"in-process p50 {one['in_process_p50_ms']} ms, median delta {one['median_delta_ms']} ms")
        print("x many: reads/s over in-process retrieve_many alone; x same load: over in-process "
              "retrieve_many under the same writes (alone, or beside the in-process writer)")
        print(f"{'readers':>7s} {'writer':>6s} {'kill-9':>6s} {'reads/s':>8s} {'x many':>7s} {'x same':>7s} "
              f"{'p50':>7s} {'p95':>7s} {'p99':>7s} {'failed':>6s} {'down':>5s} {'acked':>6s} {'lost':>5s} "
              f"{'srv cpu':>7s} {'cli cpu':>7s}")
        for r in rows:
            same = beside["retrieve_many_qps"] if r["writer"] else reference["retrieve_many_qps"]
            print(f"{r['readers']:7d} {str(r['writer']):>6s} {str(r['kill_9']):>6s} {r['reads_per_s']:8.1f} "
                  f"{r['reads_per_s'] / reference['retrieve_many_qps']:7.2f} {r['reads_per_s'] / same:7.2f} "
                  f"{r['p50_ms']:7.2f} "
                  f"{r['p95_ms']:7.2f} {r['p99_ms']:7.2f} {r['failed']:6d} {r['refused_while_down']:5d} "
                  f"{r['acked_writes']:6d} {r['lost_writes']:5d} "
                  f"{'-' if r['server_cores'] is None else r['server_cores']:>7} {r['client_cores']:7.2f}")
    return 0 if all(r["failed"] == 0 and r["lost_writes"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
