"""Executors: the same input gives the same index in this process, in worker processes and on a
local two-node Ray cluster (real spaCy, MiniLM, DuckDB and FAISS in every worker), at the default
embedder precision (each worker resolves ``auto`` itself; vectors compared within its tolerance)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    assert_same_index,
    check_consistency,
    default_config,
    dump_index,
    index_config,
    run_cli,
)

import hipgraph
from hipgraph.config import ChatConfig, EmbedderConfig, ExtractorConfig
from hipgraph.errors import ConfigError
from hipgraph.indexers.compute import BatchWork, extract_batch, from_arrow, to_arrow
from hipgraph.indexers.executors import create_executor
from hipgraph.models.hashing import HashingEmbedder
from hipgraph.types import Chunk, Document


@pytest.fixture(scope="module")
def docs(sample_docs):
    return sample_docs[:12]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, default_embedder, docs):
    """The index built by the default executor (this process, a thread per stage)."""
    path = tmp_path_factory.mktemp("executors") / "local"
    with hipgraph.open(path, create=True, config=default_config(batch_size=4), embedder=default_embedder) as hg:
        hg.add_documents(docs)
    return dump_index(path)


def test_worker_processes_give_the_same_index(tmp_path, default_embedder, docs, reference):
    path = tmp_path / "workers"
    with hipgraph.open(path, create=True, config=default_config(batch_size=4), embedder=default_embedder) as hg:
        report = hg.add_documents(docs, workers=2)
        assert report.added == len(docs) and report.seconds["extract"] > 0
        check_consistency(hg)
    assert_same_index(reference, dump_index(path))


def test_ray_two_node_cluster_gives_the_same_index(tmp_path, default_embedder, docs, reference):
    import ray  # the [ray] extra: installed by the README's test command, so this runs in CI
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    try:
        path = tmp_path / "ray"
        with hipgraph.open(path, create=True, config=default_config(batch_size=4),
                           embedder=default_embedder) as hg:
            report = hg.add_documents(docs, executor="ray", ray_address=cluster.address)
            assert report.added == len(docs)
            assert not ray.is_initialized()  # the executor connected, and disconnected when done
            check_consistency(hg)
        ray.init(address=cluster.address)  # a session the caller holds is used and left open
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2  # really two worker nodes
        assert_same_index(reference, dump_index(path))
        again = tmp_path / "ray-again"
        with hipgraph.open(again, create=True, config=default_config(batch_size=4),
                           embedder=default_embedder) as hg:
            hg.add_documents(docs[:4], executor="ray")
        assert ray.is_initialized()
        assert dump_index(again)["stats"]["documents"] == 4
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_batch_work_travels_as_one_arrow_row_unchanged():
    doc = Document("d1", "Ada Lovelace wrote notes on the Analytical Engine. She lived in London.", "Ada")

    class Fixed:
        name = "fixed"

        def extract(self, chunks):
            from hipgraph.types import Extraction, Triple

            return [Extraction(("Ada Lovelace", "London"), (Triple("Ada Lovelace", "lived in", "London"),),
                               {"London": "GPE"}) for _ in chunks]

    work = extract_batch([doc], index_config(), Fixed())
    emb = HashingEmbedder(EmbedderConfig(name="hashing", dimension=16))
    from hipgraph.indexers.compute import embed_batch

    work = embed_batch(work, emb)
    import pyarrow as pa

    table = pa.table(to_arrow(work, seq=3))
    seq, back = from_arrow(table.to_pylist()[0], 16)
    assert seq == 3 and isinstance(back, BatchWork)
    assert back.chunks == work.chunks and all(isinstance(c, Chunk) for c in back.chunks)
    assert back.mentions == work.mentions and back.facts == work.facts
    assert back.names == work.names == ["ada lovelace", "london"]
    assert back.fact_texts == ["ada lovelace lived in london"]
    for a, b in ((back.passage_vectors, work.passage_vectors), (back.name_vectors, work.name_vectors),
                 (back.fact_vectors, work.fact_vectors)):
        assert np.array_equal(a, b)
    assert np.array_equal(back.name_vector_rows(["london"]), work.name_vectors[1:2])


def test_hashing_embedder_is_deterministic_and_word_based():
    emb = HashingEmbedder(EmbedderConfig(name="hashing", dimension=384))
    a, b, c, d = emb.embed(["Kalo Mirten founded Vas Labs", "kalo mirten founded vas labs!",
                            "Kalo Mirten", "a completely different sentence"])
    assert np.allclose(np.linalg.norm(emb.embed(["x y", ""]), axis=1), 1.0)
    assert np.allclose(a, b)  # case and punctuation do not matter
    assert a @ c > 0.45 and abs(a @ d) < 0.25  # 2 of 5 words shared: cosine about 0.63; none: about 0
    again = HashingEmbedder(EmbedderConfig(name="hashing", dimension=384), cache_words=1)
    assert np.allclose(again.embed(["Kalo Mirten founded Vas Labs"])[0], a)  # cache-independent


def test_executor_options_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="workers must be >= 1"):
        create_executor("local", index_config(), dimension=384, workers=0)
    llm = index_config(extractor=ExtractorConfig(name="llm", chat=ChatConfig(base_url="http://x", model="m")))
    with pytest.raises(ConfigError, match="llm extractor"):
        create_executor("local", llm, dimension=384, workers=2)
    bad = run_cli("index", "--db", str(tmp_path / "x"), str(tmp_path / "none.jsonl"), "--ray-address", "a:1")
    assert bad.returncode != 0 and "--ray-address needs --executor ray" in bad.stderr
    bad = run_cli("index", "--db", str(tmp_path / "x"), str(tmp_path / "none.jsonl"), "--workers", "0")
    assert bad.returncode != 0 and "--workers must be >= 1" in bad.stderr


def test_cli_ray_executor_on_a_local_cluster(tmp_path, docs):
    import json

    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps(d) + "\n" for d in docs[:4]))
    ray_db, local_db = tmp_path / "ray", tmp_path / "local"
    out = run_cli("index", "--db", str(ray_db), str(source), "--executor", "ray", "--workers", "2", "--json", "-q",
                  timeout=600)
    assert out.returncode == 0, out.stderr
    assert run_cli("index", "--db", str(local_db), str(source), "--json", "-q").returncode == 0
    assert_same_index(dump_index(local_db), dump_index(ray_db))


def test_conversations_through_worker_processes_give_the_same_memory(tmp_path, default_embedder):
    from test_conversations import _conversation

    paths = {"local": tmp_path / "local", "workers": tmp_path / "workers"}
    for name, path in paths.items():
        with hipgraph.open(path, create=True, config=default_config(), embedder=default_embedder) as hg:
            hg.add_conversation(_conversation(), **({"workers": 2} if name == "workers" else {}))
            hits = hg.retrieve("Where did Ana move in June?", k=2)
            assert hits[0].turn_ids and hits[0].conversation == "ana-ben"  # unit metadata survived the trip
    assert_same_index(dump_index(paths["local"]), dump_index(paths["workers"]))


class _NamesExtractor:
    """Capitalised words as entities (a stand-in input for the executor under test); records the
    thread each call ran on and fails on a passage that says ``FAIL``."""

    name = "names-test"

    def __init__(self):
        self.threads: set[str] = set()

    def extract(self, chunks):
        import threading

        from hipgraph.errors import ExtractionError
        from hipgraph.types import Extraction

        self.threads.add(threading.current_thread().name)
        if any("FAIL" in c.text for c in chunks):
            raise ExtractionError("passage says FAIL")
        return [Extraction(entities=tuple(w for w in c.text.split() if w[:1].isupper()), triples=())
                for c in chunks]


class _ThreadRecordingEmbedder(HashingEmbedder):
    def __init__(self):
        super().__init__()
        self.threads: set[str] = set()

    def embed(self, texts):
        import threading

        self.threads.add(threading.current_thread().name)
        return super().embed(texts)


def test_local_executor_extracts_and_embeds_on_own_threads_in_order_and_passes_on_errors():
    from hipgraph.errors import ExtractionError
    from hipgraph.indexers.executors import ThreadExecutor

    extractor, embedder = _NamesExtractor(), _ThreadRecordingEmbedder()
    executor = ThreadExecutor(lambda: extractor, embedder, index_config())
    batches = [(k, [Document(id=f"d{k}", text=f"Alice met Bob{k} in Paris")]) for k in range(6)]
    try:
        out = [(key, work) for key, work in executor.map(iter(batches))]
    finally:
        executor.close()
    assert [key for key, _ in out] == list(range(6))  # input order
    assert {t.rsplit("_", 1)[0] for t in extractor.threads} == {"hipgraph-extract"}
    assert {t.rsplit("_", 1)[0] for t in embedder.threads} == {"hipgraph-embed"}
    for key, work in out:
        assert work.names == sorted({"alice", f"bob{key}", "paris"})  # normalized names
        assert work.passage_vectors.shape == (1, embedder.dimension)
        np.testing.assert_array_equal(work.name_vectors, embedder.embed(work.names))

    # the batch whose extraction fails: the ones before it come out, its error is raised in order
    executor = ThreadExecutor(lambda: extractor, embedder, index_config())
    bad = batches[:3] + [(3, [Document(id="bad", text="this one says FAIL")])] + batches[4:]
    seen = []
    with pytest.raises(ExtractionError, match="FAIL"):
        for key, _ in executor.map(iter(bad)):
            seen.append(key)
    executor.close()
    assert seen == [0, 1, 2]


def test_local_executor_loads_the_embedding_model_on_the_calling_thread_once_a_batch_comes():
    """Loaded by the embedding thread instead, a build from the main thread ran 12-29% slower
    (README): the model is loaded by the thread that calls ``map``, and only when there is work."""
    import threading

    from hipgraph.indexers.executors import ThreadExecutor
    from hipgraph.models.embedders import MiniLMEmbedder

    embedder = MiniLMEmbedder(EmbedderConfig(precision="fp32"))  # its own instance: not loaded yet
    executor = ThreadExecutor(lambda: _NamesExtractor(), embedder, index_config())
    try:
        assert list(executor.map(iter([]))) == []
        assert embedder.loaded_on is None  # no batch, no model
        out = list(executor.map(iter([(0, [Document(id="d0", text="Alice met Bob in Paris")])])))
    finally:
        executor.close()
    assert embedder.loaded_on == threading.get_ident()
    assert out[0][1].passage_vectors.shape == (1, embedder.dimension)
