"""One ``HipGraph`` handle shared by many threads, through the public API only.

The truth is serial: a second copy of the same index gets the same document batches in the same
order, one call at a time, and after each batch (each *generation*) every probe below — retrieve
in all six modes, ``retrieve_many``, ``decompose``, ``expand``, ``answer`` (context only),
``facts`` and ``stats`` — is recorded. Indexing is deterministic (identical input gives identical
ids and vectors), so the serial value of generation ``g`` is what any read of generation ``g``
must return.

Then 8 reader threads loop over the probes on one handle while a writer thread applies the
batches. Every read must raise nothing and equal the serial value of one generation (never a
mix); the generation must lie between the last batch that had finished when the read started and
the last batch that had started when it ended; a thread's generations never go backwards (where
several generations give the same value, any of them may be the one seen: the check looks for one
non-decreasing choice). After the writer, every probe equals the last generation's value.
"""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import INLINE_DOCS, SAMPLE_BUNDLE, _load_bundle_docs

import hipgraph

MODES = ("graph", "dense", "bm25", "hybrid", "decompose", "expand")
K = 5
READERS = 8
RUNS = 2
# a thread that makes no progress for this long is reported as stuck (a deadlock, not a slow machine)
STUCK_S = 180.0

INLINE_BY_ID = {d["id"]: d for d in INLINE_DOCS}
_MUSIQUE = {d["id"]: d for d in _load_bundle_docs()}
# The index starts as conftest's inline index (12 documents written like the MuSiQue sample's,
# built once per session); these batches of the sample's own documents are applied in order, and
# every batch changes some probe's serial value.
BATCHES: list[tuple[str, Any]] = [
    ("add", [_MUSIQUE[i] for i in ("m34", "m35", "m36", "m26")]),  # Hank Snow, Hello Love, Publix, Tennessee
    ("add", [_MUSIQUE[i] for i in ("m46", "m49")]),  # Canon law: the third question's documents
    ("add", [_MUSIQUE["m6"], {**INLINE_BY_ID["apa"], "text": INLINE_BY_ID["apa"]["text"]  # one replaced
                              + " It publishes the Journal of Psychotherapy Integration."}]),
    ("delete", ["jpi", "m26"]),
]


def _questions() -> list[str]:
    bundle = json.loads(SAMPLE_BUNDLE.read_text(encoding="utf-8"))
    return [q["question"] for q in bundle["questions"][:3]]


QUESTIONS = _questions()


# ------------------------------------------------------------------ probes
def _hits(hits) -> tuple:
    return tuple((h.doc_id, h.passage_id, float(h.score)) for h in hits)


def _probes() -> dict[tuple, Callable[[hipgraph.HipGraph], Any]]:
    """Every read the readers make, by name, as a function of the handle giving a comparable value."""
    probes: dict[tuple, Callable[[hipgraph.HipGraph], Any]] = {}
    for qi, q in enumerate(QUESTIONS):
        for mode in MODES:
            probes[("retrieve", mode, qi)] = lambda hg, q=q, mode=mode: _hits(hg.retrieve(q, k=K, mode=mode))
        probes[("answer", qi)] = lambda hg, q=q: (lambda a: (a.context, _hits(a.hits)))(hg.answer(q, k=K))
    q = QUESTIONS[1]  # the direct calls, on the question whose documents come and go
    probes[("decompose", 1)] = lambda hg: _hits(hg.decompose(q, k=K).hits)
    probes[("expand", 1)] = lambda hg: (
        _hits((e := hg.expand(q, k=K)).hits),
        tuple((f.subject, f.relation, f.object, f.source, f.verified) for f in e.facts))
    for mode in ("graph", "dense", "bm25", "hybrid", "decompose"):
        probes[("retrieve_many", mode)] = lambda hg, mode=mode: tuple(
            _hits(h) for h in hg.retrieve_many(QUESTIONS, k=K, mode=mode))
    probes[("facts",)] = lambda hg: tuple(
        (f.id, f.subject, f.relation, f.object, tuple(f.passage_ids)) for f in hg.facts())
    probes[("stats",)] = lambda hg: dict(hg.stats())
    return probes


PROBES = _probes()


def same(a: Any, b: Any) -> bool:
    """Equal, floats within 1e-5 relative (vectors of two builds may differ in the last bits)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(
            a, b, rel_tol=1e-5, abs_tol=1e-9)
    if isinstance(a, tuple | list):
        return isinstance(b, tuple | list) and len(a) == len(b) and all(
            same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    return a == b


def apply_batch(hg: hipgraph.HipGraph, batch: tuple[str, Any]) -> None:
    kind, payload = batch
    if kind == "add":
        hg.add_documents(payload)
    else:
        hg.delete_documents(payload)


# ------------------------------------------------------------------ serial reference
@dataclass
class Reference:
    template: Path  # the initial index, closed (copy it)
    values: list[dict[tuple, Any]]  # per generation: probe -> serial value

    def generations(self, probe: tuple, value: Any) -> frozenset[int]:
        return frozenset(g for g, vals in enumerate(self.values) if same(value, vals[probe]))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, embedder, inline_template) -> Reference:
    serial = tmp_path_factory.mktemp("concurrency") / "serial"
    shutil.copytree(inline_template, serial)
    values = []
    with hipgraph.open(serial, embedder=embedder) as hg:
        values.append({name: probe(hg) for name, probe in PROBES.items()})
        for batch in BATCHES:
            apply_batch(hg, batch)
            values.append({name: probe(hg) for name, probe in PROBES.items()})
    # the test can only see a mix if the generations differ: every batch changes some probe,
    # and every retrieval mode changes somewhere in the sequence
    for g in range(1, len(values)):
        changed = [p for p in PROBES if not same(values[g][p], values[g - 1][p])]
        assert changed, f"batch {g} changes no probe: it cannot show a mix of generations"
    for mode in MODES:
        assert any(not same(values[g][("retrieve", mode, qi)], values[0][("retrieve", mode, qi)])
                   for g in range(1, len(values)) for qi in range(len(QUESTIONS))), (
            f"no batch changes a {mode} ranking")
    return Reference(inline_template, values)


# ------------------------------------------------------------------ the concurrent run
@dataclass
class Read:
    thread: int
    probe: tuple
    finished_before: int  # batches finished when the read started
    started_by: int  # batches started when the read ended
    value: Any = None
    error: str | None = None  # "ExceptionType: message"
    trace: str = ""


class Shared:
    """What the writer publishes to the readers (plain attributes, written by one thread)."""

    def __init__(self, readers: int):
        self.started = 0
        self.finished = 0
        self.done = threading.Event()
        self.reads_of = [Counter() for _ in range(readers)]  # per reader: reads by finished_before
        self.writer_errors: list[str] = []


def read_once(hg, thread: int, probe: tuple, shared: Shared, log: list[Read]) -> None:
    finished_before = shared.finished
    read = Read(thread, probe, finished_before, -1)
    try:
        read.value = PROBES[probe](hg)
    except Exception as exc:  # noqa: BLE001 - every failure is collected and reported by the test
        read.error = f"{type(exc).__name__}: {exc}"
        read.trace = traceback.format_exc()
    read.started_by = shared.started
    log.append(read)
    shared.reads_of[thread][finished_before] += 1


def reader(hg, thread: int, shared: Shared, barrier: threading.Barrier, log: list[Read],
           after_writer: int) -> None:
    names = list(PROBES)
    start = thread * len(names) // READERS
    order = names[start:] + names[:start]  # threads begin on different probes
    barrier.wait(timeout=STUCK_S)
    i = 0
    while not shared.done.is_set():
        read_once(hg, thread, order[i % len(order)], shared, log)
        i += 1
    for _ in range(after_writer):
        read_once(hg, thread, order[i % len(order)], shared, log)
        i += 1


def writer(hg, shared: Shared, barrier: threading.Barrier, readers: int) -> None:
    """Apply the batches one by one; before each (and before stopping the readers) wait until
    every reader has finished a read begun in the current generation, so reads overlap writes
    and every generation is read."""

    def wait_for_readers(generation: int) -> bool:
        deadline = time.monotonic() + STUCK_S
        while any(c[generation] == 0 for c in shared.reads_of):
            if time.monotonic() > deadline:
                shared.writer_errors.append(
                    f"readers {[t for t, c in enumerate(shared.reads_of) if c[generation] == 0]} "
                    f"finished no read in generation {generation} within {STUCK_S:.0f} s")
                return False
            time.sleep(0.002)
        return True

    try:
        barrier.wait(timeout=STUCK_S)
        for j, batch in enumerate(BATCHES):
            if not wait_for_readers(j):
                return
            shared.started = j + 1
            apply_batch(hg, batch)
            shared.finished = j + 1
        wait_for_readers(len(BATCHES))
    except Exception:  # noqa: BLE001 - reported by the test
        shared.writer_errors.append(traceback.format_exc())
    finally:
        shared.done.set()


def run_threads(targets: list[Callable[[], None]]) -> list[str]:
    """Start all ``targets`` (they meet at a barrier), join them; names of those still running
    after STUCK_S."""
    threads = [threading.Thread(target=t, daemon=True, name=f"t{i}") for i, t in enumerate(targets)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 4 * STUCK_S
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]


# ------------------------------------------------------------------ checking
def _short(value: Any, width: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width] + "..."


def problems(log: list[Read], ref: Reference, last: int) -> list[str]:
    """Everything wrong with the reads: exceptions (counted by type), values of no generation,
    generations outside a read's window, and threads whose generations go backwards."""
    out: list[str] = []
    errors = [r for r in log if r.error is not None]
    if errors:
        kinds = Counter(r.error.split(":", 1)[0] for r in errors)
        out.append(f"{len(errors)} of {len(log)} reads raised: "
                   + ", ".join(f"{k} x{n}" for k, n in kinds.most_common()))
        seen: set[str] = set()
        for r in errors:
            kind = r.error.split(":", 1)[0]
            if kind not in seen:
                seen.add(kind)
                out.append(f"  first {kind} in {r.probe}:\n{r.trace}")
    unmatched, outside, backwards = [], [], []
    by_thread: dict[int, list[tuple[Read, frozenset[int]]]] = {}
    for r in log:
        if r.error is not None:
            continue
        gens = ref.generations(r.probe, r.value)
        if not gens:
            unmatched.append(r)
            continue
        window = frozenset(range(r.finished_before, r.started_by + 1))
        if not gens & window:
            outside.append((r, gens))
            continue
        by_thread.setdefault(r.thread, []).append((r, gens & window))
    for thread, reads in by_thread.items():
        current = 0  # the smallest generation consistent with this thread's reads so far
        for r, gens in reads:
            later = [g for g in gens if g >= current]
            if not later:
                backwards.append((thread, r, gens, current))
                break
            current = min(later)
    if unmatched:
        r = unmatched[0]
        out.append(f"{len(unmatched)} reads equal the serial value of no generation (0..{last}); first: "
                   f"{r.probe} during generations {r.finished_before}..{r.started_by}\n"
                   f"  read:   {_short(r.value)}\n"
                   f"  serial: {_short(ref.values[r.finished_before][r.probe])}")
    if outside:
        r, gens = outside[0]
        out.append(f"{len(outside)} reads show a generation that was not current while they ran; "
                   f"first: {r.probe} ran during {r.finished_before}..{r.started_by}, "
                   f"shows {sorted(gens)}")
    if backwards:
        thread, r, gens, current = backwards[0]
        out.append(f"{len(backwards)} threads saw the index go back; first: thread {thread} read "
                   f"{r.probe} as generation {sorted(gens)} after generation {current}")
    return out


def check_final(hg, ref: Reference) -> list[str]:
    wrong = []
    for name, probe in PROBES.items():
        value = probe(hg)
        if not same(value, ref.values[-1][name]):
            wrong.append(f"after the writer, {name} is {_short(value)}\n"
                         f"  serial: {_short(ref.values[-1][name])}")
    return wrong


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("run", range(RUNS))
def test_readers_see_whole_generations_while_one_writer_adds_and_deletes(reference, tmp_path, embedder, run):
    """8 reader threads and 1 writer on one handle: every read is one generation's serial value,
    in order, and the handle ends equal to the serial index."""
    path = tmp_path / "shared"
    shutil.copytree(reference.template, path)
    hg = hipgraph.open(path, embedder=embedder)
    stuck: list[str] = []
    try:
        shared = Shared(READERS)
        barrier = threading.Barrier(READERS + 1)
        logs: list[list[Read]] = [[] for _ in range(READERS)]
        stuck = run_threads(
            [lambda t=t: reader(hg, t, shared, barrier, logs[t], after_writer=2) for t in range(READERS)]
            + [lambda: writer(hg, shared, barrier, READERS)])
        found = [f"threads still running after {4 * STUCK_S:.0f} s: {stuck}"] if stuck else []
        found += [f"writer: {e}" for e in shared.writer_errors]
        log = [r for thread_log in logs for r in thread_log]
        found += problems(log, reference, len(BATCHES))
        if not stuck:
            found += check_final(hg, reference)
        assert not found, f"run {run}, {len(log)} reads:\n" + "\n".join(found)
        # every generation was read by every reader, so the checks above saw reads overlap writes
        assert shared.finished == len(BATCHES)
        for t in range(READERS):
            assert all(shared.reads_of[t][g] for g in range(len(BATCHES) + 1)), (t, shared.reads_of[t])
    finally:
        if not stuck:
            hg.close()


def test_readers_share_one_read_only_handle(reference, tmp_path, embedder):
    """8 threads on one ``read_only=True`` handle, each making a quarter of the probes from its own
    starting point (every probe is read by two threads): all equal the serial values."""
    path = tmp_path / "ro"
    shutil.copytree(reference.template, path)
    with hipgraph.open(path, read_only=True, embedder=embedder) as hg:
        shared = Shared(READERS)
        shared.done.set()  # no writer: each reader makes its fixed number of reads
        barrier = threading.Barrier(READERS)
        logs: list[list[Read]] = [[] for _ in range(READERS)]
        stuck = run_threads([lambda t=t: reader(hg, t, shared, barrier, logs[t], after_writer=len(PROBES) // 4)
                             for t in range(READERS)])
        assert not stuck, f"threads still running after {4 * STUCK_S:.0f} s: {stuck}"
        log = [r for thread_log in logs for r in thread_log]
        assert len(log) == READERS * (len(PROBES) // 4)
        found = problems(log, Reference(reference.template, reference.values[:1]), 0)
        assert not found, f"{len(log)} reads:\n" + "\n".join(found)


def test_the_checks_flag_errors_mixes_stale_and_backward_reads():
    """The read checks on made-up reads of one probe whose serial values are 1, 2, 2, 3 (the
    middle generations agree): each kind of wrong read is caught, ambiguity is not."""
    ref = Reference(Path("unused"), [{("p",): v} for v in (1, 2, 2, 3)])

    def read(thread, value, window=(0, 3), error=None):
        return Read(thread, ("p",), *window, value=value, error=error)

    # value 2 is generation 1 or 2: thread 0 reads it in 0..3, then in 0..1 (so it was 1), then 1..2
    fine = [read(0, 2), read(0, 2, (0, 1)), read(0, 2, (1, 2)), read(0, 3), read(1, 1), read(1, 3, (3, 3))]
    assert problems(fine, ref, 3) == []
    assert problems(fine + [read(2, 9)], ref, 3)[0].startswith("1 reads equal the serial value of no")
    assert "not current" in problems(fine + [read(2, 1, (2, 3))], ref, 3)[0]  # stale: 1 after batch 2
    assert "not current" in problems(fine + [read(2, 3, (0, 2))], ref, 3)[0]  # from the future
    assert "go back" in problems(fine + [read(0, 2, (0, 3))], ref, 3)[0]  # 2 after 3 in thread 0
    assert "go back" in problems([read(0, 2, (2, 3)), read(0, 2, (0, 1))], ref, 3)[0]  # 2, then 1
    errors = problems(fine + [read(3, None, error="ResourceInUseException: busy")], ref, 3)
    assert errors[0] == "1 of 7 reads raised: ResourceInUseException x1"
