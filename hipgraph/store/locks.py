"""The lock that keeps readers and the one writer of an index apart.

Readers (retrieval, facts, stats) hold the shared side for a whole call; a writer holds the
exclusive side only while it publishes a batch: DuckDB's COMMIT and the FAISS updates that go with
it. Extraction, embedding and the transaction body run beside the readers (DuckDB readers see the
last commit until then). So a read sees one index generation from start to end, never half a batch.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ReadWriteLock:
    """Many readers or one writer; a waiting writer goes before readers that arrive after it.

    Reentrant per thread: a reader may read again (``answer`` calls ``retrieve``), and the
    writing thread may read while it holds the exclusive side.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer: int | None = None  # thread ident holding the exclusive side
        self._writer_depth = 0
        self._waiting_writers = 0
        self._local = threading.local()

    def _read_depth(self) -> int:
        return getattr(self._local, "depth", 0)

    @contextmanager
    def shared(self) -> Iterator[None]:
        me = threading.get_ident()
        if self._writer == me or self._read_depth():
            self._local.depth = self._read_depth() + 1
            try:
                yield
            finally:
                self._local.depth -= 1
            return
        with self._cond:
            while self._writer is not None or self._waiting_writers:
                self._cond.wait()
            self._readers += 1
        self._local.depth = 1
        try:
            yield
        finally:
            self._local.depth = 0
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        me = threading.get_ident()
        if self._writer == me:
            self._writer_depth += 1
            try:
                yield
            finally:
                self._writer_depth -= 1
            return
        if self._read_depth():
            raise RuntimeError("a thread that is reading the index cannot publish a write from inside "
                               "that read (it would wait for itself)")
        with self._cond:
            self._waiting_writers += 1
            try:
                while self._writer is not None or self._readers:
                    self._cond.wait()
            finally:
                self._waiting_writers -= 1
            self._writer = me
            self._writer_depth = 1
        try:
            yield
        finally:
            with self._cond:
                self._writer = None
                self._writer_depth = 0
                self._cond.notify_all()
