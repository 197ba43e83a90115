"""Synonym edges are a function of the stored entity vectors alone: the same edges and weights
whatever the batch size or document order, and exactly the documented rule (exact cosine of the
stored float32 vectors >= threshold, inclusive) even for a pair a float32 score puts on the
wrong side of the threshold."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
from conftest import (
    check_consistency,
    exact_dot,
    index_config,
    stored_vectors,
    synonym_edges_by_brute_force,
)

from hipgraph.config import SynonymConfig

N_DOCS = 12


def _synonyms_by_name(hg) -> tuple[dict[tuple[str, str], float], dict[str, int]]:
    """Synonym edges as sorted name pairs with their stored weights, and degrees by name."""
    con = hg.store.con
    name = dict(con.execute("SELECT id, name FROM entities").fetchall())
    edges = {tuple(sorted((name[s], name[d]))): float(w) for s, d, w in con.execute(
        "SELECT src, dst, weight FROM edges WHERE type = 'synonym'").fetchall()}
    degrees = dict(con.execute("SELECT name, synonym_degree FROM entities").fetchall())
    return edges, degrees


def _vectors_by_name(hg) -> dict[str, np.ndarray]:
    ids, vectors = stored_vectors(hg.store.con, "entity")
    name = dict(hg.store.con.execute("SELECT id, name FROM entities").fetchall())
    return {name[int(i)]: v for i, v in zip(ids.tolist(), vectors, strict=True)}


def test_synonym_edges_do_not_depend_on_batch_size_or_document_order(make_index, sample_docs):
    """Batch sizes 3 and all, and a shuffled order: the same synonym pairs, degrees and
    weights (within 1e-6: the stored vectors of one name differ by ~1e-7 between batchings),
    weights bit-identical where both names' vectors are, and each build equal to the brute-force
    rule."""
    docs = sample_docs[:N_DOCS]
    shuffled = list(docs)
    random.Random(15).shuffle(shuffled)
    builds = {}
    for label, batch_size, order in (("three", 3, docs), ("all", N_DOCS, docs), ("shuffled", 5, shuffled)):
        hg = make_index(label, config=index_config(synonyms=SynonymConfig(threshold=0.55, max_neighbors=8)))
        hg.add_documents(order, batch_size=batch_size)
        check_consistency(hg)
        builds[label] = (*_synonyms_by_name(hg), _vectors_by_name(hg))
    edges, degrees, vectors = builds["all"]
    assert len(edges) >= 50 and max(degrees.values()) > 8, (len(edges), max(degrees.values()))  # cap bites
    for label, (other_edges, other_degrees, other_vectors) in builds.items():
        assert set(other_edges) == set(edges), (
            f"{label}: only here {sorted(set(other_edges) - set(edges))}, "
            f"missing {sorted(set(edges) - set(other_edges))}")
        assert other_degrees == degrees, label
        for pair, weight in edges.items():
            assert abs(other_edges[pair] - weight) <= 1e-6, (label, pair, other_edges[pair], weight)
            if all(np.array_equal(vectors[n], other_vectors[n]) for n in pair):
                assert other_edges[pair] == weight, (label, pair, other_edges[pair], weight)


def _float32_scores(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All pairs' inner products as float32 computes them: FAISS flat search and numpy matmul."""
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    scores, ids = index.search(vectors, len(vectors))
    by_faiss = np.empty_like(scores)
    np.put_along_axis(by_faiss, ids, scores, axis=1)
    return by_faiss, vectors @ vectors.T


def _boundary_thresholds(vectors: np.ndarray) -> list[tuple[float, tuple[int, int], bool]]:
    """Two thresholds, each on a pair whose float32 scores (FAISS and numpy alike) lie on the
    other side of it than the exact cosine: ``(threshold, (row a, row b), exact says similar)``,
    one where the exact rule includes the pair and one where it excludes it."""
    exact = vectors.astype(np.float64) @ vectors.astype(np.float64).T
    by_faiss, by_numpy = _float32_scores(vectors)
    out = []
    for below in (True, False):  # float32 below the exact cosine: a threshold between includes
        sign = 1.0 if below else -1.0
        gap = exact - np.maximum(by_faiss, by_numpy) if below else np.minimum(by_faiss, by_numpy) - exact
        gap[np.tril_indices(len(vectors))] = -np.inf
        gap[(exact < 0.6) | (exact > 0.95)] = -np.inf
        a, b = np.unravel_index(int(np.argmax(gap)), gap.shape)
        assert gap[a, b] > 2e-8, "no pair whose float32 score is clearly off its exact cosine"
        threshold = float(exact[a, b] - sign * gap[a, b] / 2)
        similar = exact_dot(vectors[a], vectors[b]) >= Fraction(threshold)
        assert similar == below
        out.append((threshold, (int(a), int(b)), similar))
    return out


def test_threshold_decision_is_the_exact_cosine_not_a_float32_score(make_index, sample_docs):
    """Thresholds placed between a pair's exact cosine and its float32 scores: the pair is an edge
    exactly when the exact cosine is >= the threshold, and the whole edge set and every degree
    equal the brute-force rule (exact near the threshold) over the stored vectors."""
    docs = sample_docs[:N_DOCS]
    probe = make_index("probe")
    probe.add_documents(docs, batch_size=5)
    ids, vectors = stored_vectors(probe.store.con, "entity")
    for k, (threshold, (a, b), similar) in enumerate(_boundary_thresholds(vectors)):
        config = SynonymConfig(threshold=threshold, max_neighbors=10_000)
        hg = make_index(f"at{k}", config=index_config(synonyms=config))
        hg.add_documents(docs, batch_size=5)
        same_ids, same_vectors = stored_vectors(hg.store.con, "entity")
        assert np.array_equal(same_ids, ids) and np.array_equal(same_vectors, vectors), "not deterministic"
        stored = {(int(s), int(d)): float(w) for s, d, w in hg.store.con.execute(
            "SELECT src, dst, weight FROM edges WHERE type = 'synonym'").fetchall()}
        assert ((int(ids[a]), int(ids[b])) in stored) == similar, (threshold, similar)
        expected, degree = synonym_edges_by_brute_force(vectors, config)
        assert set(stored) == {(int(ids[r]), int(ids[c])) for r, c in expected}
        for (r, c), cosine in expected.items():
            assert abs(stored[(int(ids[r]), int(ids[c]))] - cosine) <= 1e-12
        saved = dict(hg.store.con.execute("SELECT id, synonym_degree FROM entities").fetchall())
        assert [saved[int(i)] for i in ids] == degree.tolist()
        check_consistency(hg)


def test_synonym_edges_over_an_ivf_entity_index_equal_faiss_scan_and_by_list_products(
        make_index, sample_docs, monkeypatch):
    """Over an IVF entity index, a batch's candidates come from FAISS's range search, one query at
    a time, or from one matrix product per probed list once a batch probes each list often
    enough: both probe the same lists and decode the same codes, so the edges, weights and
    degrees are the same; with every list probed both equal the brute-force rule."""
    from hipgraph.config import VectorIndexConfig
    from hipgraph.store import vectors as vectors_module

    docs = sample_docs[:N_DOCS]
    synonyms = SynonymConfig(threshold=0.55, max_neighbors=8)
    searched = []  # query rows per call of the list products
    real = vectors_module.FaissVectorIndex._ivf_range_search
    monkeypatch.setattr(vectors_module.FaissVectorIndex, "_ivf_range_search",
                        lambda self, queries, *a: searched.append(len(queries)) or real(self, queries, *a))
    builds = {}
    for nprobe in (4, 1):
        for path, per_list in (("scan", 10**9), ("products", 1)):
            monkeypatch.setattr(vectors_module, "IVF_BLAS_QUERIES_PER_LIST", per_list)
            searched.clear()
            vectors = VectorIndexConfig(kind="ivf", ivf_nlist=4, ivf_nprobe=nprobe, min_train_size=40,
                                        use_gpu="never")
            hg = make_index(f"{path}{nprobe}", config=index_config(synonyms=synonyms, vectors=vectors))
            hg.add_documents(docs[:4], batch_size=4)  # enough entities to train the IVF lists
            assert hg.vectors.indexes["entity"].layout == "ivf"
            hg.add_documents(docs[4:], batch_size=4)
            assert (sum(searched) > 100) == (path == "products"), searched  # the path asked for
            if nprobe == 4:  # every list probed: the search is exact up to the SQ8 margin
                check_consistency(hg)
            builds[path, nprobe] = _synonyms_by_name(hg)
    for nprobe in (4, 1):
        edges, degrees = builds["scan", nprobe]
        assert len(edges) > 50
        assert builds["products", nprobe] == (edges, degrees), nprobe
