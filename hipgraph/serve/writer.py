"""The server's single writer: one thread that runs write calls in the order they came, fed by a
bounded queue.

A request that writes hands its call to :meth:`WriteQueue.submit` and waits for the result,
which comes back only after the call returned, that is after its batch is committed; a full
queue refuses at once (:class:`QueueFull`, answered 503 with ``Retry-After``). :meth:`close`
lets the calls already queued finish, then stops the thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
_STOP = object()


class QueueFull(Exception):
    """The write queue holds ``capacity`` calls already."""


class WriteQueue:
    """One writer thread behind a queue of at most ``capacity`` pending calls."""

    def __init__(self, capacity: int = 64, on_idle: Callable[[], None] | None = None,
                 idle_after: float = 1.0):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._on_idle = on_idle  # run on the writer thread after idle_after s without a call
        self._idle_after = idle_after
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=capacity)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hipgraph-writer", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], T]) -> T:
        """Run ``call`` on the writer thread and return its result (or raise its exception)."""
        if self._closed.is_set():
            raise QueueFull("the server is shutting down")
        future: Future[T] = Future()
        try:
            self._queue.put_nowait((call, future))
        except queue.Full as exc:
            raise QueueFull(f"{self.capacity} writes are waiting already") from exc
        return future.result()

    def pending(self) -> int:
        return self._queue.qsize()

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self._idle_after if self._on_idle else None)
            except queue.Empty:
                try:
                    self._on_idle()
                except Exception:  # noqa: BLE001 - a failed idle task never stops the writer
                    logger.warning("the writer's idle task failed", exc_info=True)
                continue
            if item is _STOP:
                return
            call, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting request
                future.set_exception(exc)

    def close(self, timeout: float | None = None) -> None:
        """Refuse new calls, finish the queued ones, stop the thread."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._queue.put(_STOP)
        self._thread.join(timeout)
