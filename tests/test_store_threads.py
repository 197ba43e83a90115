"""The store's thread-safety parts: the read/write lock, per-thread cursors, publishing commits."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hipgraph.errors import StoreError
from hipgraph.store.database import GraphStore
from hipgraph.store.locks import ReadWriteLock


def _run(*targets, timeout: float = 20.0) -> list[BaseException]:
    """Run each target in a thread; return the exceptions they raised."""
    errors: list[BaseException] = []

    def wrap(fn):
        def inner():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - collected and re-raised by the test
                errors.append(exc)
        return inner

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "thread hung (deadlock?)"
    return errors


def test_readers_share_and_a_writer_waits_for_them():
    lock = ReadWriteLock()
    inside = threading.Barrier(2)
    events: list[str] = []
    release = threading.Event()

    def reader():
        with lock.shared():
            inside.wait(5)  # all three readers are inside at once
            events.append("read")
            release.wait(5)

    def writer():
        time.sleep(0.2)
        with lock.exclusive():
            events.append("write")

    def releaser():
        time.sleep(0.5)
        events.append("release")
        release.set()

    errors = _run(reader, reader, writer, releaser)
    assert not errors
    assert events.count("read") == 2
    # the writer got in only after the readers had been released
    assert events.index("write") > events.index("release")


def test_a_waiting_writer_goes_before_new_readers_and_reentrant_reads_do_not_deadlock():
    lock = ReadWriteLock()
    order: list[str] = []
    first_in = threading.Event()
    writer_waiting = threading.Event()

    def first_reader():
        with lock.shared():
            first_in.set()
            writer_waiting.wait(5)
            time.sleep(0.2)
            with lock.shared():  # a nested read while a writer waits must not deadlock
                order.append("nested read")
            order.append("first read done")

    def writer():
        first_in.wait(5)
        writer_waiting.set()
        with lock.exclusive():
            order.append("write")

    def late_reader():
        writer_waiting.wait(5)
        time.sleep(0.1)  # arrives after the writer queued
        with lock.shared():
            order.append("late read")

    assert not _run(first_reader, writer, late_reader)
    assert order.index("nested read") < order.index("first read done") < order.index("write")
    assert order.index("write") < order.index("late read")


def test_publishing_from_inside_a_read_is_refused_not_deadlocked():
    lock = ReadWriteLock()
    with lock.shared(), pytest.raises(RuntimeError, match="cannot publish"), lock.exclusive():
        pass
    with lock.exclusive(), lock.shared():  # the writer may read
        pass


def test_each_thread_gets_its_own_cursor_and_sees_commits_only(tmp_path):
    store = GraphStore.open(tmp_path / "ix", create=True, new_schema=lambda: (4, {}))
    try:
        cursors: dict[str, object] = {}
        seen_during: list[int] = []
        in_tx = threading.Event()
        check_done = threading.Event()

        def writer():
            cursors["writer"] = store.con
            with store.transaction():
                store.bump_generation()
                in_tx.set()
                check_done.wait(5)
                assert store.generation == 1  # the writer sees its own transaction

        def reader():
            cursors["reader"] = store.con
            in_tx.wait(5)
            seen_during.append(store.generation)
            seen_during.append(int(store.meta_get("generation")))
            check_done.set()

        assert not _run(writer, reader)
        assert cursors["writer"] is not cursors["reader"]
        assert seen_during == [0, 0]  # uncommitted writes of another thread are invisible
        assert store.generation == 1
    finally:
        store.close()


def test_commit_callbacks_run_before_any_reader_resumes(tmp_path):
    store = GraphStore.open(tmp_path / "ix", create=True, new_schema=lambda: (4, {}))
    state = {"faiss": 0}
    observed: list[tuple[int, int]] = []
    stop = threading.Event()
    try:
        def writer():
            for _ in range(20):
                with store.transaction():
                    g = store.bump_generation()

                    def publish(g=g):
                        time.sleep(0.002)  # a slow FAISS update: readers must not see it half done
                        state["faiss"] = g
                    store.on_commit(publish)
            stop.set()

        def reader():
            while not stop.is_set():
                with store.lock.shared():
                    observed.append((store.generation, state["faiss"]))

        assert not _run(writer, reader, reader)
        assert observed and all(g == f for g, f in observed), \
            [o for o in observed if o[0] != o[1]][:5]
        with pytest.raises(StoreError, match="on_commit needs an open transaction"):
            store.on_commit(lambda: None)
    finally:
        store.close()


def test_writers_take_turns(tmp_path):
    store = GraphStore.open(tmp_path / "ix", create=True, new_schema=lambda: (4, {}))
    try:
        def writer():
            for _ in range(25):
                with store.transaction():
                    store.bump_generation()

        assert not _run(writer, writer, writer)
        assert store.generation == 75
    finally:
        store.close()


def test_closing_closes_every_threads_cursor(tmp_path):
    store = GraphStore.open(tmp_path / "ix", create=True, new_schema=lambda: (4, {}))
    held = []
    assert not _run(lambda: held.append(store.con))
    store.close()
    with pytest.raises(Exception):  # noqa: B017 - duckdb's closed-connection error
        held[0].execute("SELECT 1")
    with pytest.raises(StoreError, match="closed"):
        _ = store.con


def test_no_connection_prints_duckdb_progress_bars(tmp_path):
    """DuckDB draws a progress bar on stdout for queries over 2 s (a large index's first BM25 or
    snapshot read), which broke ``--json`` output; every connection has it off. Checked in a
    fresh interpreter, as the CLI runs (under pytest DuckDB starts with the bar off)."""
    script = (
        "import sys, threading\n"
        "from pathlib import Path\n"
        "from hipgraph.store.database import GraphStore\n"
        "store = GraphStore.open(Path(sys.argv[1]), create=True, new_schema=lambda: (4, {}))\n"
        "q = \"SELECT current_setting('enable_progress_bar')\"\n"
        "out = [store._root_con.execute(q).fetchall()[0][0], store.con.execute(q).fetchall()[0][0]]\n"
        "t = threading.Thread(target=lambda: out.append(store.con.execute(q).fetchall()[0][0]))\n"
        "t.start(); t.join()\n"
        "print(out)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ix")], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[False, False, False]"
