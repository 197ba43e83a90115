"""Questions on ONNX Runtime: the real export of the packaged MiniLM agrees with torch on real
texts, is exported once per cache and reused, a refused export leaves torch embedding, and many
threads embed questions while another embeds a batch on torch."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from conftest import embed_questions_beside_a_batch

from hipgraph.config import EmbedderConfig
from hipgraph.models import onnx_encoder
from hipgraph.models.embedders import MiniLMEmbedder

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "musique_sample.json"


@pytest.fixture(scope="module")
def texts() -> list[str]:
    data = json.loads(SAMPLE.read_text())
    return ([q["question"] for q in data["questions"]][:20]
            + [f"{c['title']}\n{c['text']}" for c in data["corpus"]][:30]
            + [c["title"] for c in data["corpus"]][:20])


@pytest.fixture(scope="module")
def torch_fp32() -> MiniLMEmbedder:
    return MiniLMEmbedder(EmbedderConfig(precision="fp32", runtime="torch"))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HIPGRAPH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_onnx_vectors_agree_with_torch_and_the_export_is_reused(cache, texts, torch_fp32):
    onnx = MiniLMEmbedder(EmbedderConfig(precision="fp32", runtime="onnx"))
    got = onnx.embed(texts)  # every call on ONNX Runtime, batches too
    assert onnx._onnx and onnx._onnx.verdict.usable and onnx._onnx.verdict.agreement >= 0.9999
    assert onnx._onnx.file.is_relative_to(cache)
    ref = torch_fp32.embed(texts)
    cos = (got * ref).sum(axis=1)
    assert cos.min() >= 0.9999, cos.min()
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    singles = np.stack([onnx.embed([t])[0] for t in texts[:5]])  # one-thread session, one text
    assert np.allclose(singles, got[:5], atol=1e-5)

    (folder,) = (cache / "onnx").iterdir()
    stamp = (folder / "model.onnx").stat().st_mtime_ns
    again = MiniLMEmbedder(EmbedderConfig(precision="fp32", runtime="auto"))
    assert np.allclose(again.embed([texts[0]]), got[:1], atol=1e-5)  # a question: ONNX in auto
    assert again._onnx and again._onnx.file == folder / "model.onnx"
    assert [p.name for p in (cache / "onnx").iterdir()] == [folder.name]  # not exported again
    assert (folder / "model.onnx").stat().st_mtime_ns == stamp


def test_a_refused_export_leaves_torch_embedding(cache, texts, torch_fp32, monkeypatch, caplog):
    monkeypatch.setattr(onnx_encoder, "MIN_AGREEMENT", 1.5)  # no export can agree this well
    emb = MiniLMEmbedder(EmbedderConfig(precision="fp32", runtime="auto"))
    with caplog.at_level(logging.WARNING, logger="hipgraph.models.embedders"):
        vec = emb.embed([texts[0]])
    assert emb._onnx is False
    assert any("torch embeds instead" in r.getMessage() for r in caplog.records)
    assert np.allclose(vec, torch_fp32.embed([texts[0]]), atol=1e-6)
    (folder,) = (cache / "onnx").iterdir()  # the verdict is kept: the next load does not re-export
    verdict = json.loads((folder / "verdict.json").read_text())
    assert verdict["usable"] is False and verdict["agreement"] >= 0.9999


def test_questions_from_many_threads_beside_a_torch_batch(texts):
    emb = MiniLMEmbedder(EmbedderConfig(precision="fp32", runtime="auto"))
    errors = embed_questions_beside_a_batch(emb, texts[:20], texts, atol=1e-5)
    assert emb._onnx  # the questions ran on it
    assert errors == []
