"""Executors run the per-document work of indexing (:mod:`hipgraph.indexers.compute`).

Every executor takes ``(key, documents)`` batches in input order and yields ``(key, work)`` in the
same order, so ids, and therefore the whole index, come out the same whichever one ran:

- ``local`` without workers: extraction and embedding on a thread each, overlapping each other
  and the write of the previous batch (the models are the caller's);
- ``local`` with ``workers=N``: N worker processes, each holding its own extractor and embedder;
- ``ray``: Ray Data ``map_batches`` - extraction as CPU tasks, embedding in actors that hold the
  embedder (one GPU each when the cluster has GPUs); results come back as Arrow rows.

Chosen by name through the registry (``ray`` needs ``pip install 'hipgraph[ray]'``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from hipgraph import registry
from hipgraph.config import IndexConfig
from hipgraph.errors import ConfigError
from hipgraph.indexers.compute import (
    BatchWork,
    documents_from_json,
    documents_to_json,
    embed_batch,
    extract_batch,
    from_arrow,
    to_arrow,
)
from hipgraph.indexers.extract_base import Extractor
from hipgraph.models.base import Embedder
from hipgraph.types import Document

logger = logging.getLogger(__name__)

K = TypeVar("K")


class Executor(Protocol):
    """Runs :func:`extract_batch` and :func:`embed_batch` over batches, keeping their order."""

    name: str

    def map(self, batches: Iterable[tuple[K, list[Document]]]) -> Iterator[tuple[K, BatchWork]]: ...

    def close(self) -> None: ...


def create_executor(name: str, config: IndexConfig, *, dimension: int, workers: int | None = None,
                    address: str | None = None,
                    extractor_factory: Callable[[], Extractor] | None = None,
                    embedder: Embedder | None = None) -> Executor:
    """The executor ``name`` (local | ray) for an index built with ``config``."""
    if name not in ("local", "ray"):
        raise ConfigError(f"executor must be local or ray, got {name!r}")
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    if name == "local" and not workers:
        if extractor_factory is None or embedder is None:
            raise ConfigError("the local executor without workers needs the index's extractor and embedder")
        return registry.create("executor", "local", extractor_factory, embedder, config)
    if config.extractor.name == "llm":
        raise ConfigError(f"executor {name!r} with workers cannot run the llm extractor: it caches responses "
                          "in the index database; index with --executor local and no --workers")
    if name == "local":
        return registry.create("executor", "processes", config, workers)
    if address is not None and name != "ray":
        raise ConfigError("an address is only meaningful for the ray executor")
    return registry.create("executor", name, config, dimension=dimension, workers=workers, address=address)


def _drain(pending: deque, keep: int) -> Iterator[tuple[Any, Any]]:
    """Results of the oldest futures, in submission order, until ``keep`` remain in flight."""
    while len(pending) > keep:
        key, future = pending.popleft()
        yield key, future.result()  # re-raises a worker's error: that batch is not written


class ThreadExecutor:
    """In this process, two stages on their own threads: the batch after next is extracted while
    the next one is embedded and the caller writes the previous one (spaCy and torch release the
    GIL for most of their work)."""

    name = "local"

    def __init__(self, extractor_factory: Callable[[], Extractor], embedder: Embedder, config: IndexConfig):
        self._extractor_factory = extractor_factory
        self._extractor: Extractor | None = None
        self.embedder = embedder
        self.config = config
        self._extract_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hipgraph-extract")
        self._embed_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hipgraph-embed")
        self._loaded = False

    def _extract(self, docs: list[Document]) -> BatchWork:
        if self._extractor is None:
            self._extractor = self._extractor_factory()
        return extract_batch(docs, self.config, self._extractor)

    def _embed(self, extracted: Future) -> BatchWork:
        return embed_batch(extracted.result(), self.embedder)  # an extraction error passes on

    def map(self, batches):
        pending: deque[tuple[Any, Future]] = deque()
        for key, docs in batches:
            if not self._loaded:
                self._load_embedder()
            extracted = self._extract_pool.submit(self._extract, docs)
            pending.append((key, self._embed_pool.submit(self._embed, extracted)))
            yield from _drain(pending, keep=2)
        yield from _drain(pending, keep=0)

    def _load_embedder(self) -> None:
        """Load the embedding model on the calling thread before the first batch (only when
        there is one). Loaded by the embedding thread's first call instead, a build from the main
        thread ran 12-29% slower all the way through (README, "Benchmarks"). Once per executor:
        ``load`` takes the lock the embedding thread holds while it embeds, so calling it for
        every batch would make the caller wait for the batch in flight."""
        self._loaded = True
        load = getattr(self.embedder, "load", None)
        if callable(load):
            load()

    def close(self) -> None:
        self._extract_pool.shutdown(wait=True, cancel_futures=True)
        self._embed_pool.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------------- worker processes
@functools.lru_cache(maxsize=2)
def _extractor_for(config_json: str) -> tuple[IndexConfig, Extractor]:
    """This process's extractor for ``config_json`` (made once per worker process)."""
    config = IndexConfig.from_json(config_json)
    return config, registry.create("extractor", config.extractor.name, config.extractor)


@functools.lru_cache(maxsize=2)
def _embedder_for(config_json: str) -> Embedder:
    """This process's embedder for ``config_json`` (made once per worker process or actor)."""
    config = IndexConfig.from_json(config_json)
    return registry.create("embedder", config.embedder.name, config.embedder)


def _process_work(config_json: str, docs_json: str) -> BatchWork:
    config, extractor = _extractor_for(config_json)
    return embed_batch(extract_batch(documents_from_json(docs_json), config, extractor), _embedder_for(config_json))


def _with_threads(config: IndexConfig, threads: int) -> IndexConfig:
    """``config`` whose embedder uses ``threads`` torch threads (workers share the cores)."""
    return config.replace(embedder=dataclasses.replace(config.embedder, threads=config.embedder.threads or threads))


class ProcessExecutor:
    """``workers`` processes (spawned, so no model state is forked), each with its own models;
    at most two batches per worker are in flight."""

    name = "local"

    def __init__(self, config: IndexConfig, workers: int):
        self.workers = workers
        threads = max(1, (os.cpu_count() or 1) // workers)
        self._config_json = _with_threads(config, threads).to_json()
        import multiprocessing  # noqa: PLC0415

        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))

    def map(self, batches):
        pending: deque[tuple[Any, Future]] = deque()
        for key, docs in batches:
            pending.append((key, self._pool.submit(_process_work, self._config_json, documents_to_json(docs))))
            yield from _drain(pending, keep=2 * self.workers)
        yield from _drain(pending, keep=0)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------------- Ray
def _ray_extract(batch: dict[str, Any], config_json: str) -> dict[str, Any]:
    """Ray task: extraction for each input row (one row = one batch of documents)."""
    config, extractor = _extractor_for(config_json)
    rows = [to_arrow(extract_batch(documents_from_json(row["docs"]), config, extractor), int(row["seq"]))
            for row in batch.to_pylist()]
    return _concat_rows(rows)


class RayEmbedActor:
    """Ray actor holding one embedder; embeds the rows :func:`_ray_extract` produced."""

    def __init__(self, config_json: str):
        self.embedder = _embedder_for(config_json)

    def __call__(self, batch):
        rows = []
        for row in batch.to_pylist():
            seq, work = from_arrow(row, self.embedder.dimension)
            rows.append(to_arrow(embed_batch(work, self.embedder), seq))
        return _concat_rows(rows)


def _concat_rows(rows: list[dict[str, Any]]):
    import pyarrow as pa  # noqa: PLC0415

    return pa.Table.from_batches([pa.record_batch(r) for r in rows])


class RayExecutor:
    """Ray Data over windows of batches: ``map_batches`` extraction tasks (1 CPU each) feed an
    actor pool of embedders (``num_gpus=1`` each when the cluster has GPUs). Results are handed
    back in input order (by sequence number); a window holds ``2 x workers`` batches so memory
    stays bounded on any input size."""

    name = "ray"

    def __init__(self, config: IndexConfig, *, dimension: int, workers: int | None = None,
                 address: str | None = None):
        import ray  # noqa: PLC0415

        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"logging_level": "WARNING", "log_to_driver": False}
            if address:
                ray.init(address=address, **kwargs)
            else:
                ray.init(num_cpus=workers or os.cpu_count(), **kwargs)
            self._started = True
        resources = ray.cluster_resources()
        self.cpus = int(resources.get("CPU", 1))
        self.gpus = int(resources.get("GPU", 0))
        self.workers = workers or self.cpus
        self.embed_actors = max(1, self.gpus) if self.gpus else max(1, self.workers // 2)
        self._config_json = _with_threads(config, 1 if not self.gpus else 2).to_json()
        self.dimension = dimension
        logger.info("ray executor: %d CPUs, %d GPUs, %d extraction workers, %d embedding actors",
                    self.cpus, self.gpus, self.workers, self.embed_actors)

    def _run(self, window: list[tuple[Any, list[Document]]]) -> Iterator[tuple[Any, BatchWork]]:
        import ray.data  # noqa: PLC0415

        ray.data.DataContext.get_current().enable_progress_bars = False  # hipgraph shows its own
        items = [{"seq": i, "docs": documents_to_json(docs)} for i, (_, docs) in enumerate(window)]
        ds = ray.data.from_items(items, override_num_blocks=len(items))
        ds = ds.map_batches(_ray_extract, fn_kwargs={"config_json": self._config_json}, batch_size=1,
                            batch_format="pyarrow", num_cpus=1)
        gpu = {"num_gpus": 1} if self.gpus else {"num_cpus": 0.5}
        ds = ds.map_batches(RayEmbedActor, fn_constructor_kwargs={"config_json": self._config_json},
                            batch_size=1, batch_format="pyarrow",
                            compute=ray.data.ActorPoolStrategy(size=self.embed_actors), **gpu)
        done: dict[int, BatchWork] = {}
        next_seq = 0
        for table in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            for row in table.to_pylist():
                seq, work = from_arrow(row, self.dimension)
                done[seq] = work
            while next_seq in done:  # input order, whatever order Ray finished in
                yield window[next_seq][0], done.pop(next_seq)
                next_seq += 1
        if done or next_seq != len(window):
            raise RuntimeError(f"ray returned {next_seq} of {len(window)} batches in order")

    def map(self, batches):
        window: list[tuple[Any, list[Document]]] = []
        for key, docs in batches:
            window.append((key, docs))
            if len(window) >= 2 * self.workers:
                yield from self._run(window)
                window = []
        if window:
            yield from self._run(window)

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
