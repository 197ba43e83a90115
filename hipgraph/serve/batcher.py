"""Retrieval requests that arrive together are answered by one ``retrieve_many`` call.

A request hands its questions to :meth:`ReadBatcher.retrieve` and waits. A worker thread takes
the oldest waiting request and every other one already waiting with the same settings (k, mode,
retrieval config, as_of), up to ``max_questions`` questions, and answers them with one
``retrieve_many`` call: one embedding call and one batched PageRank instead of one per request.
Nothing waits for company: a lone request is answered at once, so one client sees single-call
latency, while many concurrent clients share batches (``retrieve_many`` answers 64 questions in
about the time of 20 single calls on 2 cores).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

Key = tuple[Any, ...]


class ReadBatcher:
    """``workers`` threads answering queued retrievals in shared batches (module docstring)."""

    def __init__(self, retrieve_many: Callable[..., list[list[Any]]], max_questions: int = 64,
                 workers: int = 1):
        self._retrieve_many = retrieve_many
        self.max_questions = max_questions
        self._waiting: deque[tuple[Key, list[str], list[Any] | None, Future]] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=self._run, name=f"hipgraph-reads-{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    def retrieve(self, questions: Sequence[str], *, k: int, mode: str, config: Any,
                 question_dates: Sequence[Any] | None, as_of: Any) -> list[list[Any]]:
        """The hits of ``questions``, as ``retrieve_many`` gives them (its errors raised here)."""
        if question_dates is not None and len(question_dates) != len(questions):
            from hipgraph.errors import ConfigError  # noqa: PLC0415

            raise ConfigError(f"question_dates has {len(question_dates)} entries for {len(questions)} questions")
        future: Future = Future()
        key = (k, mode, config, as_of)
        with self._cond:
            if self._closed:
                raise RuntimeError("the server is shutting down")
            self._waiting.append((key, list(questions), None if question_dates is None else list(question_dates),
                                  future))
            self._cond.notify()
        return future.result()

    def _take(self) -> list[tuple[Key, list[str], list[Any] | None, Future]] | None:
        with self._cond:
            while not self._waiting and not self._closed:
                self._cond.wait()
            if not self._waiting:
                return None
            first = self._waiting.popleft()
            batch, size, keep = [first], len(first[1]), deque()
            while self._waiting:
                item = self._waiting.popleft()
                if item[0] == first[0] and size + len(item[1]) <= self.max_questions:
                    batch.append(item)
                    size += len(item[1])
                else:
                    keep.append(item)
            self._waiting.extendleft(reversed(keep))
            return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            key = batch[0][0]
            k, mode, config, as_of = key
            questions = [q for _, qs, _, _ in batch for q in qs]
            dated = any(d is not None for _, _, d, _ in batch)
            dates = [d for _, qs, ds, _ in batch for d in (ds if ds is not None else [None] * len(qs))] if dated else None
            try:
                results = self._retrieve_many(questions, k=k, mode=mode, config=config,
                                              question_dates=dates, as_of=as_of)
            except BaseException:  # noqa: BLE001 - answered one by one, so each gets its own error
                for _, qs, ds, future in batch:
                    try:
                        future.set_result(self._retrieve_many(qs, k=k, mode=mode, config=config,
                                                              question_dates=ds, as_of=as_of))
                    except BaseException as exc:  # noqa: BLE001 - handed to the waiting request
                        future.set_exception(exc)
                continue
            start = 0
            for _, qs, _, future in batch:
                future.set_result(results[start:start + len(qs)])
                start += len(qs)

    def close(self) -> None:
        """Answer what is waiting, then stop the workers."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:
            t.join()
