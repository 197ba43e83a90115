"""LiveBM25 (hipgraph/query/bm25_live.py) scores every text as bm25s does, bit for bit, however
its texts arrived (built at once or appended in batches of any size), and an index it was
extended from is left unchanged."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import REPO

from hipgraph.errors import ConfigError
from hipgraph.query.bm25 import BM25Config, BM25Index
from hipgraph.query.bm25_live import LiveBM25


def _lines() -> list[str]:
    data = json.loads((REPO / "data" / "locomo_conv30.json").read_text(encoding="utf-8"))
    out = [f"{t['speaker']}: {t['text']}" for t in data["conversations"][0]["turns"]]
    return out + ["", "the of and", "Ana: Ana ANA ana!"]  # empty, stopwords only, a repeated term


QUESTIONS = ["When did Jon lose his job?", "What does Gina want to open?", "ana ana",
             "the", "dance studio with the kids", "zzzunknown"]


@pytest.mark.parametrize("config", [BM25Config(), BM25Config(k1=0.9, b=0.4), BM25Config(stemming=False)])
def test_scores_equal_bm25s_bit_for_bit_however_the_texts_arrived(config):
    lines = _lines()
    assert len(lines) > 300
    want = BM25Index.build(np.arange(len(lines)), lines, config).scores_all(QUESTIONS)
    assert (want > 0).sum() > 100  # the questions match many lines
    at_once = LiveBM25.build(lines, config)
    assert np.array_equal(at_once.scores_all(QUESTIONS), want)
    rng = np.random.default_rng(0)
    grown, cuts = LiveBM25(config), sorted(rng.choice(len(lines), size=12, replace=False).tolist())
    for lo, hi in zip([0, *cuts], [*cuts, len(lines)], strict=True):
        before = grown
        grown = grown.extended(lines[lo:hi])
        if lo:  # the index it was extended from still scores its own texts
            part = BM25Index.build(np.arange(lo), lines[:lo], config).scores_all(QUESTIONS)
            assert np.array_equal(before.scores_all(QUESTIONS), part)
    assert len(grown) == len(lines) and len(grown._segments) < 8
    assert np.array_equal(grown.scores_all(QUESTIONS), want)


def test_empty_and_refused():
    assert LiveBM25().scores_all(["q"]).shape == (1, 0)
    with pytest.raises(ConfigError, match="lucene"):
        LiveBM25(BM25Config(method="robertson"))
