"""BM25 passage index (hipgraph.query.bm25) against the real bm25s library."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hipgraph.errors import ConfigError, StoreError
from hipgraph.query.bm25 import BM25Config, BM25Index, tokenize

IDS = np.array([101, 102, 103, 104, 105], dtype=np.int64)
TEXTS = [
    "Carl Rogers\nCarl Rogers was an American psychologist and founder of client-centered therapy.",
    "Journal of Psychotherapy Integration\nA peer-reviewed journal on psychotherapy integration.",
    "Paris\nParis is the capital of France and its largest city.",
    "Eiffel Tower\nThe Eiffel Tower is a wrought-iron tower in Paris, France.",
    "Mount Everest\nMount Everest is the highest mountain above sea level.",
]


@pytest.fixture(scope="module")
def index() -> BM25Index:
    return BM25Index.build(IDS, TEXTS)


def test_best_passage_by_term_overlap(index: BM25Index) -> None:
    scores, ids = index.search(["Which tower stands in Paris?", "psychotherapy journal",
                                "highest mountain"], k=2)
    assert scores.dtype == np.float32 and ids.dtype == np.int64
    assert scores.shape == ids.shape == (3, 2)
    assert ids[0].tolist() == [104, 103]  # tower x2 + paris beats paris alone
    assert ids[1, 0] == 102
    assert ids[2].tolist() == [105, -1]  # only one passage shares a token
    assert scores[2, 1] == 0.0
    assert np.all(np.diff(scores[0]) <= 0) and scores[0, 1] > 0
    assert len(index) == 5


def test_k_larger_than_corpus_pads(index: BM25Index) -> None:
    scores, ids = index.search(["Paris France capital city tower"], k=8)
    assert ids.shape == (1, 8)
    assert set(ids[0, :2].tolist()) == {103, 104}
    assert ids[0, 2:].tolist() == [-1] * 6
    assert np.all(scores[0, 2:] == 0.0)


def test_no_match_and_empty_queries(index: BM25Index) -> None:
    scores, ids = index.search(["", "zebra quasar", "the of and is"], k=3)
    assert np.all(ids == -1) and np.all(scores == 0.0)
    scores, ids = index.search([], k=3)
    assert scores.shape == ids.shape == (0, 3)


def test_empty_corpus(tmp_path: Path) -> None:
    empty = BM25Index.build(np.zeros(0, dtype=np.int64), [])
    assert len(empty) == 0
    scores, ids = empty.search(["anything at all"], k=4)
    assert ids.tolist() == [[-1] * 4] and np.all(scores == 0.0)
    empty.save(tmp_path / "bm25")
    again = BM25Index.load(tmp_path / "bm25")
    assert len(again) == 0
    assert again.search(["anything"], k=2)[1].tolist() == [[-1, -1]]
    # Documents without a single indexable token behave the same way.
    blank = BM25Index.build(np.array([1, 2], dtype=np.int64), ["", "the of"])
    assert blank.search(["the"], k=2)[1].tolist() == [[-1, -1]]


def test_ties_by_score_then_id() -> None:
    ids = np.array([7, 3, 9, 5], dtype=np.int64)
    texts = ["red apple", "red apple", "green pear", "red apple"]
    idx = BM25Index.build(ids, texts)
    scores, got = idx.search(["red apple"], k=4)
    assert got[0].tolist() == [3, 5, 7, -1]
    assert scores[0, 0] == scores[0, 1] == scores[0, 2] > 0
    # Ties across the k boundary keep the smallest ids.
    assert idx.search(["apple"], k=2)[1].tolist() == [[3, 5]]
    again = BM25Index.build(ids[::-1].copy(), texts[::-1])
    assert again.search(["red apple"], k=4)[1].tolist() == [[3, 5, 7, -1]]


def test_stemming_matches_inflections() -> None:
    import Stemmer  # noqa: F401  PyStemmer is a dependency of hipgraph: fail, never skip
    ids = np.array([1, 2], dtype=np.int64)
    texts = ["She runs every morning.", "He swims in the lake."]
    stemmed = BM25Index.build(ids, texts, BM25Config(stemming=True))
    assert stemmed.search(["running"], k=2)[1].tolist() == [[1, -1]]
    plain = BM25Index.build(ids, texts, BM25Config(stemming=False))
    assert plain.search(["running"], k=2)[1].tolist() == [[-1, -1]]
    assert tokenize(["running runs"], BM25Config(stemming=True)) == [["run", "run"]]


def test_save_load_round_trip(index: BM25Index, tmp_path: Path) -> None:
    folder = tmp_path / "bm25"
    index.save(folder)
    index.save(folder)  # overwriting an existing index works and leaves no temp folders
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bm25"]
    loaded = BM25Index.load(folder)
    assert loaded.config == index.config and len(loaded) == len(index)
    queries = ["Which tower stands in Paris?", "psychotherapy journal", "nothing matches zzz"]
    for k in (1, 3, 7):
        s1, i1 = index.search(queries, k)
        s2, i2 = loaded.search(queries, k)
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(s1, s2)
    assert BM25Index.load(folder, BM25Config()).config == BM25Config()


def test_round_trip_bm25plus(tmp_path: Path) -> None:
    cfg = BM25Config(method="bm25+")
    idx = BM25Index.build(IDS, TEXTS, cfg)
    idx.save(tmp_path / "p")
    loaded = BM25Index.load(tmp_path / "p", cfg)
    a, b = idx.search(["Paris tower"], 5), loaded.search(["Paris tower"], 5)
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_allclose(a[0], b[0])
    assert a[1][0, :2].tolist() == [104, 103] and a[1][0, 2] == -1


def test_load_errors(index: BM25Index, tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        BM25Index.load(tmp_path / "missing")
    folder = tmp_path / "bm25"
    index.save(folder)
    with pytest.raises(StoreError):
        BM25Index.load(folder, BM25Config(k1=1.2))
    (folder / "ids.npy").write_bytes(b"not a numpy file")
    with pytest.raises(StoreError):
        BM25Index.load(folder)
    index.save(folder)
    (folder / "data.csc.index.npy").unlink()
    with pytest.raises(StoreError):
        BM25Index.load(folder)
    index.save(folder)
    (folder / "hipgraph_bm25.json").write_text("{broken", encoding="utf-8")
    with pytest.raises(StoreError):
        BM25Index.load(folder)
    index.save(folder)
    meta = json.loads((folder / "hipgraph_bm25.json").read_text(encoding="utf-8"))
    meta["num_docs"] = 99
    (folder / "hipgraph_bm25.json").write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(StoreError):
        BM25Index.load(folder)


@pytest.mark.parametrize("kwargs", [
    {"k1": 0.0}, {"k1": -1.0}, {"b": -0.1}, {"b": 1.5}, {"method": "okapi"},
    {"stopwords": "klingon"}, {"k1": "1.5"},
])
def test_invalid_config(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        BM25Config(**kwargs)


def test_valid_config_edges() -> None:
    """b=0 and b=1, robertson, no stopwords and no stemming are accepted and used: scores equal
    the formula computed here with those values."""
    ids = np.array([1, 2, 3], dtype=np.int64)
    texts = ["apple", "apple banana cherry date elderberry fig", "the running of the pears"]
    n, lengths = 3, [1, 6, 5]  # no stopwords, no stems: every word is a token
    avgdl = sum(lengths) / n

    def lucene_idf(df: int) -> float:
        return math.log(1 + (n - df + 0.5) / (df + 0.5))

    # b=0: no length normalisation, so both one-"apple" passages score the same
    flat = BM25Index.build(ids, texts, BM25Config(b=0.0))
    scores, got = flat.search(["apple"], k=3)
    assert got[0].tolist() == [1, 2, -1]
    want = lucene_idf(2) * 1 / (1 + 1.5)
    np.testing.assert_allclose(scores[0, :2], [want, want], rtol=1e-5)
    default = BM25Index.build(ids, texts).search(["apple"], k=3)[0]
    assert default[0, 0] > default[0, 1]  # b=0.75 (default) favours the short passage
    # b=1, robertson idf ln((N - df + 0.5) / (df + 0.5)) floored at 0, stopwords and stems kept
    cfg = BM25Config(b=1.0, method="robertson", stopwords="none", stemming=False)
    assert tokenize(["the running pears"], cfg) == [["the", "running", "pears"]]
    robertson = BM25Index.build(ids, texts, cfg)
    scores, got = robertson.search(["the running"], k=3)
    assert got[0].tolist() == [3, -1, -1]
    idf = math.log((n - 1 + 0.5) / (1 + 0.5))

    def term(tf: int) -> float:  # b=1: full length normalisation
        return tf / (tf + cfg.k1 * lengths[2] / avgdl)

    np.testing.assert_allclose(scores[0, 0], idf * (term(2) + term(1)), rtol=1e-5)
    assert robertson.search(["run"], k=1)[1].tolist() == [[-1]]  # not stemmed
    assert BM25Index.build(ids, texts).search(["the"], k=1)[1].tolist() == [[-1]]  # a stopword


def test_matches_hand_computed_lucene_bm25() -> None:
    cfg = BM25Config(k1=1.2, b=0.75, method="lucene")
    texts = [
        "apple banana apple cherry",
        "banana banana date",
        "cherry date elderberry fig grape apple",
        "fig",
    ]
    ids = np.array([40, 30, 20, 10], dtype=np.int64)
    idx = BM25Index.build(ids, texts, cfg)
    query = "apple banana fig"

    docs = tokenize(texts, cfg)
    (q_tokens,) = tokenize([query], cfg)
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    df = Counter(t for d in docs for t in set(d))
    expected = {}
    for doc_id, doc in zip(ids.tolist(), docs, strict=True):
        tf = Counter(doc)
        score = 0.0
        for term in q_tokens:
            if tf[term] == 0:
                continue
            idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
            norm = tf[term] + cfg.k1 * (1 - cfg.b + cfg.b * len(doc) / avgdl)
            score += idf * tf[term] * (cfg.k1 + 1) / norm
        expected[doc_id] = score

    scores, got = idx.search([query], k=4)
    want = sorted(expected, key=lambda d: (-expected[d], d))
    assert got[0].tolist() == want
    # bm25s' "lucene" variant (like Lucene >= 8) drops the constant (k1 + 1) numerator factor:
    # same ranking, scores scaled by 1 / (k1 + 1).
    np.testing.assert_allclose(scores[0] * (cfg.k1 + 1), [expected[d] for d in want], rtol=1e-5)
