"""Cost bounded by the index, not by the request: ``k`` far beyond the passages held costs what
``k = passages`` costs, in every mode and in FAISS; questions have a documented length limit;
the CLI turns bad requests (empty question, ``k < 1``, a question over the limit, an unknown mode)
into exit status 2 with a one-line message - on real DuckDB, FAISS, MiniLM and spaCy."""

from __future__ import annotations

import json
import math
import tracemalloc

import numpy as np
import pytest
from conftest import MULTIHOP_QUESTION, REPO, SAMPLE_BUNDLE, cli_in_process, copy_index, run_cli

from hipgraph.config import RetrievalConfig, VectorIndexConfig
from hipgraph.errors import ConfigError
from hipgraph.query.engine import MODES
from hipgraph.store.vectors import FaissVectorIndex

# k = 10**12: a (k,)-sized array is terabytes, which numpy refuses at once (MemoryError) instead
# of filling the machine; k = 10**7: 80 MB per array, which the tracemalloc bound catches.
HUGE_KS = (10**7, 10**12)
PEAK_BYTES = 16 * 2**20  # Python/numpy allocations of one small-index query (measured ~1-3 MB)
UNMATCHED = "xyzzy plugh quux"  # no entity, no fact: graph mode falls back to dense


def _dicts(batches):
    return [[h.to_dict() for h in hits] for hits in batches]


def _same(a, b) -> bool:
    """Equal hits, floats within 1e-6 relative: the test is about k, not about the last bits.
    (The same question's vector was once seen to differ by 3e-8 between two calls: a lone
    question was sometimes batched with its own spans, see
    :func:`test_a_question_gets_the_same_hits_every_time`.)"""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _peak(call):
    """``call()``'s result and the peak of Python/numpy memory traced while it ran."""
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# ------------------------------------------------------------------ k clamped to the index
@pytest.mark.parametrize("mode", MODES)
def test_k_beyond_the_index_returns_all_passages_at_no_extra_cost(inline_index, mode):
    hg = inline_index
    n = hg.stats()["passages"]
    questions = [MULTIHOP_QUESTION, UNMATCHED]
    at_n = hg.retrieve_many(questions, k=n, mode=mode)  # also warms the view's caches
    assert all(len(hits) <= n for hits in at_n) and at_n[0]
    for k in HUGE_KS:
        got, peak = _peak(lambda k=k: hg.retrieve_many(questions, k=k, mode=mode))
        assert _same(_dicts(got), _dicts(at_n)), (mode, k)
        assert peak < PEAK_BYTES, (mode, k, peak)


def test_decompose_and_expand_entry_points_clamp_k(inline_index):
    hg = inline_index
    n = hg.stats()["passages"]
    for run in (hg.decompose, hg.expand):
        for question in (MULTIHOP_QUESTION, UNMATCHED):  # graph ranking; dense fallback
            at_n = [h.to_dict() for h in run(question, k=n).hits]
            got, peak = _peak(lambda run=run, question=question: run(question, k=10**12))
            assert [h.to_dict() for h in got.hits] == at_n and at_n
            assert peak < PEAK_BYTES, (run.__name__, question, peak)


def _memory_index(make_index):
    turns = ["Hi Ben! I just moved into a flat in Lisbon, near the river.",
             "Lisbon is lovely. Do you like the new job at Acme Bank?",
             "Yes, Acme Bank gave me a desk with a view of the Tagus."]
    hg = make_index("memory")
    hg.add_conversation({"id": "ana-ben", "speakers": ["Ana", "Ben"], "sessions": [
        {"id": str(s), "time": f"10:00 am on {day} January, 2023",
         "turns": [{"id": f"S{s}:{i}", "speaker": "Ana" if i % 2 else "Ben", "text": t}
                   for i, t in enumerate(turns, start=1)]} for s, day in ((1, 15), (2, 20))]})
    return hg


def test_a_question_gets_the_same_hits_every_time(make_index):
    """The question's vector must not depend on what it is embedded with. A lone question was
    embedded on a helper thread from a list the caller then extended with the question's
    unlinked spans ("January"), so it was sometimes batched with them, and its scores moved in
    the last bits (the rounded turn cosine in ``why`` by 1e-6) in about 4 calls in 10."""
    hg = _memory_index(make_index)
    config = RetrievalConfig(memory_hits="turn")
    first = _dicts(hg.retrieve_many(["Where did Ana move in January?"], k=6, mode="graph", config=config))
    for _ in range(12):
        again = _dicts(hg.retrieve_many(["Where did Ana move in January?"], k=6, mode="graph", config=config))
        assert again == first


def test_conversation_memory_clamps_k_and_its_candidates(make_index):
    hg = _memory_index(make_index)
    n = hg.stats()["passages"]
    # memory_candidates far beyond the index: ranked over what the index holds; k counts
    # turns with turn hits (6 here), units with unit hits
    for hits, size in (("turn", 6), ("unit", n)):
        cfg = RetrievalConfig(memory_candidates=10**12, memory_hits=hits)
        for mode in ("dense", "bm25", "graph"):
            at_n = hg.retrieve_many(["Where did Ana move in January?"], k=size, mode=mode,
                                    config=RetrievalConfig(memory_hits=hits))
            assert len(at_n[0]) == size and at_n[0][0].turn_ids
            got, peak = _peak(lambda mode=mode, cfg=cfg: hg.retrieve_many(
                ["Where did Ana move in January?"], k=10**12, mode=mode, config=cfg))
            assert _same(_dicts(got), _dicts(at_n)), (hits, mode)
            assert peak < PEAK_BYTES, (hits, mode, peak)


def test_faiss_search_never_returns_more_columns_than_the_index_holds():
    d, n = 8, 5
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((n, d)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.array([40, 10, 30, 20, 50], dtype=np.int64)
    index = FaissVectorIndex(d, VectorIndexConfig(use_gpu="never"))
    index.build(ids, vectors)
    queries = rng.standard_normal((2, d)).astype(np.float32)
    # the reference: brute-force inner products, best first
    brute = queries.astype(np.float64) @ vectors.T.astype(np.float64)
    expected = [ids[np.argsort(-row, kind="stable")].tolist() for row in brute]
    (scores, found), peak = _peak(lambda: index.search(queries, 10**12))
    assert found.shape == scores.shape == (2, n)
    assert found.tolist() == expected
    assert np.allclose(scores, np.sort(brute, axis=1)[:, ::-1], atol=1e-5)
    assert peak < 2**20
    assert index.search(queries, 3)[1].tolist() == [row[:3] for row in expected]
    empty = FaissVectorIndex(d, VectorIndexConfig(use_gpu="never"))
    (e_scores, e_ids), peak = _peak(lambda: empty.search(queries, 10**12))
    assert e_ids.shape == e_scores.shape == (2, 0) and peak < 2**20


# ------------------------------------------------------------------ question length
def test_the_question_limit_covers_every_real_question():
    """The default limit leaves every question of the repo's bundles untouched, with room."""
    sample = json.loads(SAMPLE_BUNDLE.read_text(encoding="utf-8"))["questions"]
    locomo = json.loads((REPO / "data" / "locomo_conv30.json").read_text(encoding="utf-8"))
    lengths = [len(q["question"]) for q in sample]
    lengths += [len(str(qa["question"])) for conv in locomo["conversations"] for qa in conv["questions"]]
    assert len(lengths) > 100
    # (the longest of /work/shared/data's multihop and LoCoMo bundles: 224 characters)
    assert RetrievalConfig().max_question_chars == 4000 >= 10 * max(lengths)


def test_a_question_over_the_limit_is_refused_naming_it(inline_index):
    hg = inline_index
    limit = RetrievalConfig().max_question_chars
    long_question = "Who founded the American Psychological Association? " * 80  # 4,160 chars
    assert len(long_question) > limit
    for mode in ("graph", "expand"):
        with pytest.raises(ConfigError, match=rf"question 1 is {len(long_question)} characters long, "
                                              rf"over the limit of {limit} \(RetrievalConfig"):
            hg.retrieve_many([MULTIHOP_QUESTION, long_question], k=2, mode=mode)
    huge = "word " * 400_000  # 2 MB: refused before spaCy or the embedder see it
    with pytest.raises(ConfigError, match="question 0 is 2000000 characters long"):
        hg.retrieve(huge, k=2)
    for run in (hg.decompose, hg.expand):
        with pytest.raises(ConfigError, match=f"over the limit of {limit}"):
            run(long_question, k=2)
    # the limit is a setting: exactly at it is accepted, one character more is not
    cfg = RetrievalConfig(max_question_chars=len(MULTIHOP_QUESTION))
    assert hg.retrieve(MULTIHOP_QUESTION, k=2, config=cfg)
    with pytest.raises(ConfigError, match=f"over the limit of {len(MULTIHOP_QUESTION)}"):
        hg.retrieve(MULTIHOP_QUESTION + "?", k=2, config=cfg)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="max_question_chars"):
            RetrievalConfig(max_question_chars=bad)


# ------------------------------------------------------------------ CLI exit codes
def _one_line_error(err: str) -> str:
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("hipgraph: error: "), err
    return err


def test_cli_user_errors_exit_2_with_one_line(inline_template, tmp_path, capsys):
    db = str(copy_index(inline_template, tmp_path))
    cases = [([""], "question 0 is empty"), (["   "], "question 0 is empty"),
             (["-k", "0", "anything"], "k must be an integer >= 1, got 0"),
             (["-k", "-3", "anything"], "k must be an integer >= 1, got -3"),
             (["x" * 4001], "question 0 is 4001 characters long, over the limit of 4000"),
             (["--mode", "dense", "-k", "0", "anything"], "k must be an integer >= 1")]
    for args, message in cases:
        assert cli_in_process("query", "--db", db, *args) == 2, args
        assert message in _one_line_error(capsys.readouterr().err), args
    with pytest.raises(SystemExit) as unknown:  # argparse: usage and exit status 2
        cli_in_process("query", "--db", db, "--mode", "sparse", "anything")
    assert unknown.value.code == 2 and "invalid choice: 'sparse'" in capsys.readouterr().err
    # the same through the installed entry point, in its own process
    proc = run_cli("query", "--db", db, "-k", "0", "anything")
    assert proc.returncode == 2 and "k must be an integer >= 1" in _one_line_error(proc.stderr)
    proc = run_cli("query", "--db", db, "--answer", "--generator", "none", "y" * 4001)
    assert proc.returncode == 2 and "over the limit of 4000" in _one_line_error(proc.stderr)
