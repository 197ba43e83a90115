"""The disposable caches beside the database (graph snapshot, BM25 folders, FAISS files) are verified
on load, not trusted: damaged arrays, a cache built from other database content with the same
generation number, and damaged FAISS vectors are detected and rebuilt from DuckDB."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import MULTIHOP_QUESTION, copy_index

import hipgraph
from hipgraph.config import VectorIndexConfig
from hipgraph.query.bm25 import BM25Config, BM25Index
from hipgraph.query.snapshot import build_snapshot, cache_dir
from hipgraph.store.vectors import FaissVectorIndex

GRAPH_QUESTION = "Which village next to Chicago was Carl Rogers born in?"
DOC_A = {"id": "river", "title": "Chattahoochee River",
         "text": "The Chattahoochee River flows through Atlanta, Georgia. It forms part of the "
                 "border between Georgia and Alabama."}
DOC_B = {"id": "oakpark", "title": "Oak Park, Illinois",
         "text": "Oak Park is a village next to Chicago, Illinois. Carl Rogers was born there "
                 "in 1902."}


def _hits(hits) -> list[tuple[int, float]]:
    return [(h.passage_id, round(float(h.score), 5)) for h in hits]


def _snapshot_arrays(snapshot) -> dict[str, np.ndarray]:
    return {name: np.asarray(getattr(snapshot, name)) for name in (
        "passage_ids", "entity_ids", "indptr", "indices", "weights", "entity_passage_indptr",
        "entity_passage_indices", "fact_ids", "fact_subject", "fact_object")}


def _assert_same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name


@pytest.mark.parametrize(("array", "read_only"), [("indices", False), ("indices", True),
                                                   ("entity_passage_indices", False),
                                                   ("weights", False)])
def test_damaged_graph_cache_arrays_are_rebuilt(inline_template, tmp_path, embedder, array,
                                                read_only):
    """Out-of-range nodes (indices: every graph query used to fail with ValueError; the mention
    matrix), and in-range changes only the checksums show (weights)."""
    path = copy_index(inline_template, tmp_path)
    with hipgraph.open(path, embedder=embedder) as hg:
        before = _hits(hg.retrieve(MULTIHOP_QUESTION, k=5))  # writes cache/graph/
    file = cache_dir(path) / f"{array}.npy"
    good = np.load(file)
    damaged = good.copy()
    if array == "weights":
        damaged[::3] *= 7.0  # still finite and positive
    else:
        damaged[::3] = np.iinfo(np.int32).max  # nodes far beyond the graph
    np.save(file, damaged)
    with hipgraph.open(path, read_only=read_only, embedder=embedder) as hg:
        assert _hits(hg.retrieve(MULTIHOP_QUESTION, k=5)) == before
        _assert_same_arrays(_snapshot_arrays(hg.retriever.snapshot()),
                            _snapshot_arrays(build_snapshot(hg.store)))
    # the rebuilt snapshot replaced the damaged files (the folder is writable in both opens)
    assert np.array_equal(np.load(file), good)


def _bm25_reference(hg, question: str, k: int) -> list[tuple[int, float]]:
    """BM25 hits of an index built here from DuckDB's rows (the documented title + text)."""
    rows = hg.store.con.execute("SELECT id, title, text FROM passages ORDER BY id").fetchall()
    index = BM25Index.build(np.array([r[0] for r in rows], np.int64),
                            [f"{t}\n{x}" if t else x for _, t, x in rows], BM25Config())
    scores, ids = index.search([question], k)
    return [(int(i), round(float(s), 5)) for s, i in zip(scores[0], ids[0], strict=True) if i >= 0]


def test_corrupt_bm25_ids_are_rebuilt(inline_index):
    hg = inline_index
    question = "Publix supermarket Lakeland Florida"
    want = _bm25_reference(hg, question, 5)
    assert want and _hits(hg.retrieve(question, k=5, mode="bm25")) == want
    (folder,) = (hg.path / "cache" / "bm25").iterdir()
    ids = np.load(folder / "ids.npy")
    np.save(folder / "ids.npy", ids + 1000)  # same dtype and shape, ids no passage has
    hg.retriever.views._view = None  # forget the read view: the index is read from disk again
    assert _hits(hg.retrieve(question, k=5, mode="bm25")) == want
    assert np.array_equal(np.load(folder / "ids.npy"), ids)  # rewritten
    # a consistent folder (checksums, stamp) whose ids are not the stored passages' is not used
    view = hg.retriever.views.current()
    source = {"generation": view.generation, "fingerprint": view.fingerprint()}
    texts = [t for _, t in sorted(hg.store.con.execute(
        "SELECT id, title || chr(10) || text FROM passages").fetchall())]
    BM25Index.build(ids[::-1].copy(), texts, BM25Config()).save(folder, source=source)
    hg.retriever.views._view = None
    assert _hits(hg.retrieve(question, k=5, mode="bm25")) == want
    # changed scores that keep the matrix well formed: only the checksums show them
    scores = np.load(folder / "data.csc.index.npy")
    np.save(folder / "data.csc.index.npy", scores * 2)
    hg.retriever.views._view = None
    assert _hits(hg.retrieve(question, k=5, mode="bm25")) == want


def test_cache_of_other_content_with_the_same_generation_is_rebuilt(inline_template, tmp_path,
                                                                   embedder):
    """An older graph.duckdb restored beside the cache/ of a newer state, then written to again:
    the generation numbers agree, the content does not."""
    path = copy_index(inline_template, tmp_path)
    backup = tmp_path / "backup.duckdb"
    shutil.copyfile(path / "graph.duckdb", backup)
    questions = [(GRAPH_QUESTION, "graph"), (GRAPH_QUESTION, "bm25"), ("Oak Park village", "bm25"),
                 (GRAPH_QUESTION, "dense")]
    with hipgraph.open(path, embedder=embedder) as hg:
        hg.add_documents([DOC_A])
        generation = hg.store.generation
        for question, mode in questions:  # caches of this state
            hg.retrieve(question, k=4, mode=mode)
    shutil.copyfile(backup, path / "graph.duckdb")
    with hipgraph.open(path, embedder=embedder) as hg:
        hg.add_documents([DOC_B])
        assert hg.store.generation == generation  # the caches' stamps carry this generation
        got = [_hits(hg.retrieve(q, k=4, mode=mode)) for q, mode in questions]
    fresh = tmp_path / "fresh"
    shutil.copytree(path, fresh, ignore=shutil.ignore_patterns("cache", "*.faiss"))
    with hipgraph.open(fresh, read_only=True, embedder=embedder) as hg:
        assert got == [_hits(hg.retrieve(q, k=4, mode=mode)) for q, mode in questions]
        assert "oakpark" in {h.doc_id for h in hg.retrieve(GRAPH_QUESTION, k=4)}


def test_random_bytes_inside_a_faiss_file_are_detected_and_rebuilt(inline_template, tmp_path,
                                                                  embedder):
    path = copy_index(inline_template, tmp_path)
    question = "Where is the headquarters of Publix?"
    with hipgraph.open(path, embedder=embedder) as hg:
        before = hg.retrieve(question, k=5, mode="dense")
        n, dim = hg.stats()["passages"], hg.vectors.dimension
    target = path / "passage.faiss"
    data = bytearray(target.read_bytes())
    # IndexIDMap2(IndexFlatIP): headers, the n x dim float32 vectors, then the n int64 ids
    end = len(data) - 8 * (n + 1)
    start = end - 4 * n * dim
    lo, hi = start + (end - start) // 3, end - (end - start) // 3  # the middle third of the vectors
    data[lo:hi] = np.random.default_rng(5).integers(0, 256, hi - lo, dtype=np.uint8).tobytes()
    target.write_bytes(bytes(data))
    with hipgraph.open(path, embedder=embedder) as hg:
        assert [r.split(":")[0] for r in hg.vectors.repaired] == ["passage"]
        assert "damaged" in hg.vectors.repaired[0]
        after = hg.retrieve(question, k=5, mode="dense")
        assert [h.passage_id for h in after] == [h.passage_id for h in before]
        assert [h.score for h in after] == pytest.approx([h.score for h in before], abs=1e-5)
        assert all(0 < h.score <= 1 for h in after)
        ids, vectors = hg.store.read_vectors("passage")
        scores, found = hg.vectors.search("passage", vectors, 1)  # every vector finds itself
        assert found[:, 0].tolist() == ids.tolist() and np.allclose(scores[:, 0], 1, atol=1e-4)
    with hipgraph.open(path, read_only=True, embedder=embedder) as hg:
        assert hg.vectors.repaired == []  # the rewritten file passes the check


def _unit(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize(("kind", "encoding"), [("flat", "flat"), ("ivf", "flat"), ("ivf", "sq8"),
                                                ("hnsw", "flat")])
def test_spot_check_reads_vectors_back_per_layout(tmp_path, kind, encoding):
    """A good file passes; a vector stored under another id, or a huge vector elsewhere (found by
    the search part only: it is not among the ids checked), fails."""
    d, n = 32, 300
    config = VectorIndexConfig(kind=kind, ivf_nlist=8, ivf_nprobe=2, min_train_size=100,
                               ivf_encoding=encoding, use_gpu="never")
    vectors = _unit(n, d, seed=3)
    ids = np.arange(500, 500 + n, dtype=np.int64)
    index = FaissVectorIndex(d, config)
    index.build(ids, vectors)
    index.save(tmp_path / "v.faiss")
    loaded = FaissVectorIndex.load(tmp_path / "v.faiss", d, config)
    assert loaded.layout == kind
    checked = np.array([0, 42, 150, 299])
    assert loaded.spot_check(ids[checked], vectors[checked]) is None
    swapped = vectors[checked].copy()
    swapped[2] = vectors[151]  # DuckDB's vector of id 650 is not the one FAISS holds under 650
    assert "vector 650 differs" in loaded.spot_check(ids[checked], swapped)
    if kind == "flat":
        big = FaissVectorIndex(d, config)
        huge = vectors.copy()
        huge[7] = 1e30 * vectors[checked].sum(axis=0)  # aligned with every vector checked
        big.build(ids, huge)
        assert "best match scores" in big.spot_check(ids[checked], vectors[checked])
