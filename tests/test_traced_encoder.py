"""Questions on a traced copy of the bf16 model: the real packaged MiniLM traced with TorchScript
gives the eager model's vectors (one text and padded small batches), runs on one-thread helper
threads without changing the process's torch threads, is refused when it disagrees, is not used
in fp32, and serves many threads while another embeds a batch on torch."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import embed_questions_beside_a_batch, needs_packing

from hipgraph.config import EmbedderConfig
from hipgraph.models import traced_encoder
from hipgraph.models.embedders import MiniLMEmbedder

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "musique_sample.json"


@pytest.fixture(scope="module")
def texts() -> list[str]:
    data = json.loads(SAMPLE.read_text())
    return ([q["question"] for q in data["questions"]][:20]
            + [f"{c['title']}\n{c['text']}" for c in data["corpus"]][:10]
            + [c["title"] for c in data["corpus"]][:10])


@pytest.fixture(scope="module")
def eager_bf16() -> MiniLMEmbedder:
    return MiniLMEmbedder(EmbedderConfig(precision="bf16", runtime="torch"))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HIPGRAPH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_traced_questions_equal_the_eager_model_on_one_helper_thread(texts, eager_bf16):
    emb = MiniLMEmbedder(EmbedderConfig(precision="bf16"))  # runtime auto
    before = torch.get_num_threads()
    singles = np.stack([emb.embed([t])[0] for t in texts])
    assert emb._traced and emb._traced.agreement >= traced_encoder.MIN_AGREEMENT
    assert emb._onnx is None  # ONNX Runtime was never needed
    ref = eager_bf16.embed(texts)
    assert (singles * ref).sum(axis=1).min() >= 0.9999
    for lo in range(0, len(texts), 5):  # padded small calls: mixed lengths, up to small_batch
        got = emb.embed(texts[lo:lo + 5])
        assert (got * ref[lo:lo + 5]).sum(axis=1).min() >= 0.9999, lo
    assert np.allclose(np.linalg.norm(singles, axis=1), 1.0, atol=1e-5)
    assert emb._traced.helper_threads() == 1  # its helpers run on one OpenMP thread each
    assert torch.get_num_threads() == before  # and the process's own count is untouched
    batch = emb.embed(texts)  # more than small_batch texts: the eager model, all threads
    assert np.allclose(batch, ref, atol=1e-6)


def test_a_disagreeing_trace_is_refused(cache, texts, eager_bf16, monkeypatch, caplog):
    monkeypatch.setattr(traced_encoder, "MIN_AGREEMENT", 1.5)  # no trace can agree this well
    emb = MiniLMEmbedder(EmbedderConfig(precision="bf16"))
    with caplog.at_level(logging.WARNING, logger="hipgraph.models.traced_encoder"):
        vec = emb.embed([texts[0]])
    assert emb._traced is False
    assert any("questions use the other runtimes" in r.getMessage() for r in caplog.records)
    assert emb._onnx and emb._onnx.verdict.usable  # the question went to ONNX Runtime instead
    assert float(vec[0] @ eager_bf16.embed([texts[0]])[0]) >= 0.9999


def test_fp32_questions_stay_on_onnx(cache, texts):
    emb = MiniLMEmbedder(EmbedderConfig(precision="fp32"))
    emb.embed([texts[0]])
    assert emb._traced is False and emb._onnx  # ONNX fp32 is the faster runtime in fp32


def test_traced_questions_from_many_threads_beside_a_torch_batch(texts):
    emb = MiniLMEmbedder(EmbedderConfig(precision="bf16"))
    errors = embed_questions_beside_a_batch(emb, texts[:20], texts, atol=1e-6)
    assert emb._traced  # the questions ran on it
    assert errors == []


@needs_packing
def test_the_trace_runs_on_prepacked_weights_and_leaves_the_model_alone(texts, eager_bf16):
    emb = MiniLMEmbedder(EmbedderConfig(precision="bf16"))
    emb.embed([texts[0]])
    before = {name: p.clone() for name, p in emb._model.named_parameters()}
    assert emb._traced and emb._traced.packed  # the faster trace was the one used
    assert all(isinstance(m, torch.nn.Linear) for name, m in emb._model.named_modules()
               if name.endswith(("query", "key", "value", "dense")))  # the eager model is unchanged
    got = np.stack([emb.embed([t])[0] for t in texts])
    assert (got * eager_bf16.embed(texts)).sum(axis=1).min() >= 0.9999
    assert all(torch.equal(p, before[name]) for name, p in emb._model.named_parameters())


@needs_packing
def test_a_disagreeing_packed_trace_falls_back_to_the_plain_one(texts, eager_bf16, monkeypatch,
                                                                caplog):
    from hipgraph.models import packed_linear

    real = packed_linear.with_packed_linears

    def damaged(model):  # a real packed copy whose first layer packs a reversed weight
        clone = real(model)
        name, linear = next((n, m) for n, m in model.named_modules()
                            if isinstance(m, torch.nn.Linear))
        wrong = torch.nn.Linear(linear.in_features, linear.out_features).to(linear.weight.dtype)
        with torch.no_grad():
            wrong.weight.copy_(torch.flip(linear.weight, dims=[0]))
            wrong.bias.copy_(linear.bias)
        parent, _, leaf = name.rpartition(".")
        setattr(clone.get_submodule(parent), leaf, packed_linear.PackedLinear(wrong))
        return clone

    monkeypatch.setattr(packed_linear, "with_packed_linears", damaged)
    emb = MiniLMEmbedder(EmbedderConfig(precision="bf16"))
    with caplog.at_level(logging.INFO, logger="hipgraph.models.traced_encoder"):
        vec = emb.embed([texts[0]])
    assert emb._traced and not emb._traced.packed
    assert any("packed trace agrees with the eager model only" in r.getMessage()
               for r in caplog.records)
    assert float(vec[0] @ eager_bf16.embed([texts[0]])[0]) >= 0.9999


def test_a_packed_copy_that_cannot_be_made_falls_back_to_the_plain_trace(texts, eager_bf16,
                                                                        monkeypatch, caplog):
    from hipgraph.models import packed_linear

    def refused(model):  # what a CPU without bf16 reorders raises
        raise RuntimeError("this CPU cannot prepack bf16 weights for oneDNN")

    monkeypatch.setattr(packed_linear, "with_packed_linears", refused)
    emb = MiniLMEmbedder(EmbedderConfig(precision="bf16"))
    with caplog.at_level(logging.INFO, logger="hipgraph.models.traced_encoder"):
        vec = emb.embed([texts[0]])
    assert emb._traced and not emb._traced.packed
    assert any("packed trace failed: this CPU cannot prepack" in r.getMessage() for r in caplog.records)
    assert float(vec[0] @ eager_bf16.embed([texts[0]])[0]) >= 0.9999
