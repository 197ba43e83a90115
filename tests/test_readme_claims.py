"""What the README promises and no other test checked: worker processes (2N batches in flight,
torch threads = cores / N), queries on one thread (torch or ONNX Runtime; the traced bf16 model in tests/test_traced_encoder.py), one embedding call per retrieve_many,
bf16 against fp32, the BM25 cache after writes and deletes, the FAISS auto layout and its
retraining, the DuckDB memory cap, ids never reused, time_mode="filter" and fact validity for
relations with many objects - on real DuckDB, FAISS, MiniLM, spaCy and worker processes."""

from __future__ import annotations

import json
import multiprocessing
import os
from datetime import datetime
from pathlib import Path

import duckdb
import numpy as np
import pytest
from conftest import SAMPLE_BUNDLE, copy_index, index_config

import hipgraph
from hipgraph.config import (
    EmbedderConfig,
    ExtractorConfig,
    IndexConfig,
    RetrievalConfig,
    VectorIndexConfig,
)
from hipgraph.indexers.executors import create_executor
from hipgraph.models.embedders import MiniLMEmbedder
from hipgraph.query import view as view_module


class RecordingEmbedder(MiniLMEmbedder):
    """The real fp32 MiniLM embedder, recording the texts of each ``embed`` call and the torch
    intra-op thread count its forward passes run with."""

    def __init__(self) -> None:
        super().__init__(EmbedderConfig(precision="fp32"))
        self.calls: list[list[str]] = []
        self.threads: list[int] = []

    def embed(self, texts):
        self.calls.append(list(texts))
        return super().embed(texts)

    def _embed_unique(self, texts):
        import torch

        self.threads.append(torch.get_num_threads())
        return super()._embed_unique(texts)


@pytest.fixture(scope="module")
def recorder() -> RecordingEmbedder:
    return RecordingEmbedder()


@pytest.fixture
def recorded_index(inline_template, tmp_path, recorder):
    """A copy of the inline index opened with the recording embedder."""
    with hipgraph.open(copy_index(inline_template, tmp_path), embedder=recorder) as hg:
        yield hg


def _no_extraction(tmp_path: Path, docs: list[dict]) -> ExtractorConfig:
    """The precomputed extractor over a file with an empty record per document."""
    extractions = tmp_path / "extractions.json"
    extractions.write_text(json.dumps({"extractions": [
        {"id": d["id"], "entities": [], "triples": []} for d in docs]}))
    return ExtractorConfig(name="precomputed", precomputed_path=str(extractions))


def _model_free_config(tmp_path: Path, docs: list[dict], **vectors) -> IndexConfig:
    """Hashing vectors, no extraction: a fast index where the test is about storage."""
    return IndexConfig(embedder=EmbedderConfig(name="hashing", dimension=32),
                       extractor=_no_extraction(tmp_path, docs),
                       vectors=VectorIndexConfig(use_gpu="never", **vectors))


# ------------------------------------------------------------------ worker processes
def _worker_torch_threads(config_json: str, barrier) -> tuple[int, bool, int]:
    """Run in a worker process: its pid, whether its embedder had embedded already (it ran
    batches), and torch's thread count after that embedder embedded a full-size batch."""
    import torch

    from hipgraph.indexers.executors import _embedder_for

    barrier.wait(timeout=120)  # every worker holds one probe, so each one answers
    embedder = _embedder_for(config_json)  # the worker's own, cached when it ran batches
    had_embedded = embedder._model is not None
    embedder.embed([f"probe sentence number {i}" for i in range(embedder.config.small_batch + 4)])
    return os.getpid(), had_embedded, torch.get_num_threads()


def test_workers_keep_2n_batches_in_flight_with_cores_over_n_torch_threads(tmp_path, embedder, inline_docs):
    """``local --workers N``: while the index writes a batch, the executor has taken at most 2N
    more from the input (and does take 2N, so it is that bound that holds it back); each worker
    process runs torch on cores // N threads."""
    workers, batch_size = 2, 1
    drawn = 0

    def documents():
        nonlocal drawn
        for doc in inline_docs:
            drawn += 1
            yield doc

    written = 0
    ahead: list[int] = []

    def progress(n: int) -> None:  # called once a batch is written
        nonlocal written
        written += n
        ahead.append(drawn - written)

    # the real MiniLM in each worker; extractions are read from a file (no spaCy to load there)
    config = index_config(extractor=_no_extraction(tmp_path, inline_docs))
    with hipgraph.open(tmp_path / "ix", create=True, config=config, embedder=embedder) as hg:
        # what add_documents(workers=2) runs, with the executor kept open to ask its workers
        runner = create_executor("local", hg.config, dimension=hg.vectors.dimension, workers=workers)
        try:
            report = hg.indexer.add_documents(documents(), progress=progress, batch_size=batch_size,
                                              executor=runner)
            ctx = multiprocessing.get_context("spawn")
            with ctx.Manager() as manager:
                barrier = manager.Barrier(workers)
                probes = [runner._pool.submit(_worker_torch_threads, runner._config_json, barrier)
                          for _ in range(workers)]
                answers = [p.result(timeout=180) for p in probes]
        finally:
            runner.close()
    assert report.added == len(inline_docs) == written
    assert len(ahead) == len(inline_docs) // batch_size
    in_flight = 2 * workers * batch_size
    assert max(ahead) <= in_flight, f"documents taken ahead of the written ones: {ahead}"
    assert max(ahead) == in_flight, f"the executor never kept 2N batches in flight: {ahead}"
    assert len({pid for pid, _, _ in answers}) == workers  # one answer from each worker process
    assert any(had for _, had, _ in answers)  # the probes met the embedders the batches used
    expected = max(1, (os.cpu_count() or 1) // workers)
    assert [threads for _, _, threads in answers] == [expected] * workers


# ------------------------------------------------------------------ query embedding
@pytest.mark.parametrize("runtime", ["torch", "auto"])
def test_queries_embed_on_one_thread(recorded_index, recorder, runtime):
    """torch: a question's forward pass runs on one torch thread whatever the process's team;
    auto (the default): on ONNX Runtime's one-thread session, and torch is not called."""
    import dataclasses

    import torch

    before, config = torch.get_num_threads(), recorder.config
    recorder.config = dataclasses.replace(config, runtime=runtime)
    torch.set_num_threads(2)  # a query must not use the process's torch team, whatever its size
    try:
        for mode in ("graph", "dense", "hybrid"):
            recorder.threads.clear()
            hits = recorded_index.retrieve("Where was Karl Rodgers born?", k=3, mode=mode)
            assert hits and hits[0].doc_id == "rogers", mode
            if runtime == "torch":
                assert recorder.threads and set(recorder.threads) == {1}, (mode, recorder.threads)
            else:
                assert recorder.threads == [], (mode, recorder.threads)
                assert set(recorder._onnx._sessions) == {1}
            assert torch.get_num_threads() == 2  # and the process's setting is left as it was
    finally:
        torch.set_num_threads(before)
        recorder.config = config


QUESTIONS = ["Where was Karl Rodgers born?",  # misspelt: its name is linked by embedding
             "Which journals does the American Psychology Assoc publish?",
             "Who founded the Niels Bohr Institute?"]


@pytest.mark.parametrize("mode", ["graph", "dense", "hybrid"])
def test_retrieve_many_makes_one_embedding_call(recorded_index, recorder, mode):
    recorder.calls.clear()
    batch = recorded_index.retrieve_many(QUESTIONS, k=3, mode=mode)
    assert batch[0][0].doc_id == "rogers" and batch[2][0].doc_id == "bohr"
    assert len(recorder.calls) == 1, f"{mode}: {len(recorder.calls)} embedding calls {recorder.calls}"
    (call,) = recorder.calls
    assert call[: len(QUESTIONS)] == QUESTIONS
    if mode != "dense":  # graph's unlinked question spans ("Karl Rodgers") ride in the same call
        assert "Karl Rodgers" in call[len(QUESTIONS):]


# ------------------------------------------------------------------ bf16
def test_bf16_embeddings_match_fp32(embedder, sample_docs):
    import torch

    texts = [f"{d['title']}\n{d['text']}" for d in sample_docs[:8]]
    texts += [q["question"] for q in json.loads(SAMPLE_BUNDLE.read_text())["questions"][:8]]
    bf16 = MiniLMEmbedder(EmbedderConfig(precision="bf16"))
    got = bf16.embed(texts)
    assert bf16.precision == "bf16" and next(bf16._model.parameters()).dtype == torch.bfloat16
    want = embedder.embed(texts)
    cosine = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosine.min() >= 0.9999, f"bf16 vs fp32 cosine: min {cosine.min():.6f}"


# ------------------------------------------------------------------ BM25 cache
def test_bm25_cache_is_rebuilt_after_adds_and_deletes(inline_index, monkeypatch):
    hg = inline_index
    cache = hg.path / "cache" / "bm25"
    # writes long after the last read: readers build (and cache) each generation's index
    monkeypatch.setattr(view_module, "WARM_AFTER_READ_S", -1.0)

    def ranked(question: str) -> list[str]:
        return [h.doc_id for h in hg.retrieve(question, k=3, mode="bm25")]

    def stamps() -> list[str]:
        return [p.name.split("-")[0] for p in cache.iterdir()]

    new = {"id": "glass", "title": "Zyxwort glassblowing",
           "text": "Zyxwort glassblowing is a craft practised in the village of Quellmoor."}
    assert ranked("Quellmoor glassblowing") == [] and ranked("Lakeland") == ["publix"]
    assert stamps() == [f"g{hg.store.generation}"]
    hg.add_documents([new])
    assert ranked("Quellmoor glassblowing") == ["glass"]
    assert stamps() == [f"g{hg.store.generation}"]  # the new generation's cache, the old one gone
    hg.delete_documents(["glass", "publix"])
    assert ranked("Quellmoor glassblowing") == [] and ranked("Lakeland") == []
    assert stamps() == [f"g{hg.store.generation}"]
    # a write while reads are coming builds the next index in memory; closing writes it
    monkeypatch.setattr(view_module, "WARM_AFTER_READ_S", 5.0)
    hg.add_documents([new])
    assert stamps() == [f"g{hg.store.generation - 1}"]
    assert ranked("Quellmoor glassblowing") == ["glass"]
    generation = hg.store.generation
    hg.close()
    assert stamps() == [f"g{generation}"]


# ------------------------------------------------------------------ FAISS layout
def _passage_layout(path: Path) -> tuple[str, int | None, int]:
    """The saved passage index: inner FAISS class, IVF lists (None for flat), vector count."""
    import faiss

    saved = faiss.read_index(str(path / "passage.faiss"))
    inner = faiss.downcast_index(saved.index)
    if isinstance(inner, faiss.IndexIVFScalarQuantizer):
        assert inner.sq.qtype == faiss.ScalarQuantizer.QT_8bit
    return type(inner).__name__, getattr(inner, "nlist", None), int(saved.ntotal)


def test_faiss_auto_layout_switches_at_the_threshold_and_retrains_after_8x(tmp_path):
    docs = [{"id": f"d{i}", "text": f"Record {i} about topic {i % 7} and subject {i % 11}."}
            for i in range(401)]
    config = _model_free_config(tmp_path, docs, auto_threshold=50)
    path = tmp_path / "ix"
    with hipgraph.open(path, create=True, config=config) as hg:
        hg.add_documents(docs[:49])
        assert _passage_layout(path) == ("IndexFlatIP", None, 49)  # below the threshold: exact
        hg.add_documents(docs[49:50])
        kind, trained_lists, n = _passage_layout(path)
        assert (kind, n) == ("IndexIVFScalarQuantizer", 50)  # at the threshold: IVF-SQ8
        hg.add_documents(docs[50:300])  # 6x its training size: the same lists
        assert _passage_layout(path) == (kind, trained_lists, 300)
    # the training size is remembered across a reopen (the extractions file is the session's to name)
    with hipgraph.open(path, extractor=config.extractor) as hg:
        hg.add_documents(docs[300:])  # past 8x 50: trained again, on more lists
        kind, lists, n = _passage_layout(path)
        assert (kind, n) == ("IndexIVFScalarQuantizer", 401) and lists > trained_lists
        assert [h.doc_id for h in hg.retrieve("Record 400 about topic 1", k=1, mode="dense")] == ["d400"]


# ------------------------------------------------------------------ DuckDB memory cap
def _duckdb_shows(limit: str) -> str:
    """How DuckDB itself reports a connection opened with ``memory_limit = limit``."""
    con = duckdb.connect(":memory:", config={"memory_limit": limit})
    try:
        return con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    finally:
        con.close()


def test_duckdb_memory_cap_is_1gb_and_the_environment_overrides_it(tmp_path, monkeypatch):
    monkeypatch.delenv("HIPGRAPH_DUCKDB_MEMORY_LIMIT", raising=False)
    config = _model_free_config(tmp_path, [])
    path = tmp_path / "ix"

    def limit(hg) -> str:
        return hg.store.con.execute("SELECT current_setting('memory_limit')").fetchone()[0]

    with hipgraph.open(path, create=True, config=config) as hg:
        assert limit(hg) == _duckdb_shows("1GB")
    monkeypatch.setenv("HIPGRAPH_DUCKDB_MEMORY_LIMIT", "300MB")
    assert _duckdb_shows("300MB") != _duckdb_shows("1GB")
    with hipgraph.open(path) as hg:
        assert limit(hg) == _duckdb_shows("300MB")
    with hipgraph.open(path, read_only=True) as hg:
        assert limit(hg) == _duckdb_shows("300MB")


# ------------------------------------------------------------------ ids
ID_TABLES = {"document": "documents", "passage": "passages", "entity": "entities", "fact": "facts"}


def _ids(hg) -> dict[str, set[int]]:
    return {kind: {int(r[0]) for r in hg.store.con.execute(f"SELECT id FROM {table}").fetchall()}
            for kind, table in ID_TABLES.items()}


def _holding_highest_ids(hg) -> list[str]:
    """Keys of the documents that hold each kind's highest id (deleting them orphans it)."""
    return [key for (key,) in hg.store.con.execute("""
        SELECT DISTINCT d.key FROM documents d JOIN passages p ON p.doc_id = d.id
        WHERE d.id = (SELECT max(id) FROM documents) OR p.id = (SELECT max(id) FROM passages)
           OR p.id IN (SELECT passage_id FROM mentions WHERE entity_id = (SELECT max(id) FROM entities))
           OR p.id IN (SELECT passage_id FROM fact_sources WHERE fact_id = (SELECT max(id) FROM facts))
        ORDER BY d.key""").fetchall()]


def test_ids_are_dense_per_kind_and_never_reused(inline_template, tmp_path, make_index):
    path = copy_index(inline_template, tmp_path)
    hg = make_index(path)
    ever = _ids(hg)
    for kind, ids in ever.items():  # dense: counters hand out 0, 1, 2, ...
        assert ids == set(range(len(ids))), kind
    batches = [
        [{"id": "lind", "title": "Astrid Lindgren",
          "text": "Astrid Lindgren was a Swedish writer. She wrote Pippi Longstocking in Stockholm."}],
        [{"id": "nansen", "title": "Fridtjof Nansen",
          "text": "Fridtjof Nansen was a Norwegian explorer. He crossed Greenland on skis in 1888."}],
    ]
    for round_, docs in enumerate(batches):
        if round_:  # the counters survive close and reopen
            hg.close()
            hg = make_index(path)
        doomed = _holding_highest_ids(hg)
        hg.delete_documents(doomed)
        after = _ids(hg)
        for kind in ID_TABLES:  # the highest id of every kind is gone: a max + 1 rule would reuse it
            assert max(ever[kind]) not in after[kind], (kind, doomed)
        hg.add_documents(docs)
        new = {kind: ids - after[kind] for kind, ids in _ids(hg).items()}
        for kind, ids in new.items():
            assert ids, kind
            top = max(ever[kind])
            assert sorted(ids) == list(range(top + 1, top + 1 + len(ids))), (kind, sorted(ids), top)
            ever[kind] |= ids


# ------------------------------------------------------------------ conversation memory
def _turns(session: str, texts: list[str]) -> list[dict]:
    return [{"id": f"{session}:{i + 1}", "speaker": "Ana" if i % 2 == 0 else "Ben", "text": t}
            for i, t in enumerate(texts)]


MEMORY = {"id": "ana", "speakers": ["Ana", "Ben"], "sessions": [
    {"id": "1", "time": "10:00 am on 15 January, 2023", "turns": _turns("1", [
        "I live in Lisbon now. Last month I visited Rome.", "Lovely! Rome must have been warm."])},
    {"id": "2", "time": "8:30 pm on 20 May, 2023", "turns": _turns("2", [
        "I tried a new pasta recipe with fresh basil and garlic.",
        "Did you make the pasta dough yourself?",
        "Yes, flour and eggs, then I cut tagliatelle and boiled them for three minutes."])},
    {"id": "3", "time": "2023-06-10 18:00", "turns": _turns("3", [
        "Big news: I live in Berlin now. Last month I visited Vienna.",
        "Berlin! That is a big change."])},
]}


@pytest.fixture(scope="module")
def memory(tmp_path_factory, embedder):
    """Ana moves from Lisbon to Berlin (a fact replaced) and visits Rome, then Vienna (a relation
    of many objects); she cooks pasta in May."""
    path = tmp_path_factory.mktemp("claims-memory") / "memory"
    with hipgraph.open(path, create=True, config=index_config(), embedder=embedder) as hg:
        hg.add_conversation(MEMORY)
        yield hg


@pytest.mark.parametrize("mode", ["graph", "dense"])
def test_time_filter_keeps_only_units_in_the_range_boost_puts_them_first(memory, mode):
    question, asked_on = "What did Ana cook last May?", "2023-08-01"
    may = (datetime(2023, 5, 1), datetime(2023, 6, 1))  # "last May" asked on 1 August 2023

    def in_may(hit) -> bool:
        return may[0] <= datetime.fromisoformat(hit.time) < may[1]

    filtered = memory.retrieve(question, k=5, mode=mode, question_date=asked_on,
                               config=RetrievalConfig(time_mode="filter"))
    assert filtered and all(in_may(h) for h in filtered), [(h.session, h.time) for h in filtered]
    boosted = memory.retrieve(question, k=5, mode=mode, question_date=asked_on)  # boost: default
    flags = [in_may(h) for h in boosted]
    assert flags == sorted(flags, reverse=True), "units in the range come first"
    assert sum(flags) == len(filtered) and not all(flags)  # and the others follow
    assert [h.passage_id for h in boosted[: len(filtered)]] == [h.passage_id for h in filtered]


def test_later_fact_replaces_the_earlier_but_many_object_relations_never_do(memory):
    facts = {(f.relation, f.object): f for f in memory.facts("Ana")}
    lisbon, berlin = facts["live in", "lisbon"], facts["live in", "berlin"]
    june = datetime(2023, 6, 10, 18, 0)
    assert (lisbon.invalid_at, lisbon.invalidated_by) == (june, berlin.id)
    assert berlin.invalid_at is None
    rome, vienna = facts["visited", "rome"], facts["visited", "vienna"]  # "visited": many places
    assert rome.valid_at == datetime(2023, 1, 15, 10, 0) and vienna.valid_at == june
    assert (rome.invalid_at, rome.invalidated_by) == (None, None)
    assert vienna.invalid_at is None
    current = {(f.relation, f.object) for f in memory.facts("Ana", current_only=True)}
    assert {("visited", "rome"), ("visited", "vienna"), ("live in", "berlin")} <= current
    assert ("live in", "lisbon") not in current
