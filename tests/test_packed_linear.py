"""Linear layers on prepacked oneDNN weights compute what ``torch.nn.Linear`` computes, for the
row counts a question, a padded small batch and a long text give, and the packed copy of the real
packaged model shares everything but its linear layers with the original."""

from __future__ import annotations

import pytest
import torch
from conftest import needs_packing

from hipgraph.models.embedders import MiniLMEmbedder
from hipgraph.models.packed_linear import PackedLinear, packing_supported, with_packed_linears


@needs_packing
@pytest.mark.parametrize("shape", [(1, 384), (20, 384), (3, 17, 384), (2048, 384)])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_equals_linear(shape, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(384, 1536, bias=bias).to(torch.bfloat16).eval()
    x = torch.randn(*shape).to(torch.bfloat16)
    with torch.inference_mode():
        want = torch.nn.functional.linear(x.float(), linear.weight.float(),
                                          None if linear.bias is None else linear.bias.float())
        got = PackedLinear(linear)(x)
    assert got.shape == (*shape[:-1], 1536) and got.dtype == torch.bfloat16
    # bf16 keeps 8 significant bits: the result is the fp32 one rounded
    assert torch.allclose(got.float(), want, rtol=1 / 64, atol=1 / 32)


@needs_packing
def test_packed_copy_of_the_packaged_model_shares_all_but_its_linears():
    emb = MiniLMEmbedder()
    emb.embed(["load"])
    model = emb._model.to(torch.bfloat16)
    clone = with_packed_linears(model)
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 6 * 6 + 1  # q, k, v, attention output, up, down per layer; the pooler
    assert all(isinstance(clone.get_submodule(n), PackedLinear) for n in linears)
    assert all(isinstance(model.get_submodule(n), torch.nn.Linear) for n in linears)
    word = model.embeddings.word_embeddings.weight
    assert clone.embeddings.word_embeddings.weight is word  # shared, not copied
    assert clone.get_submodule(linears[0]).bias is model.get_submodule(linears[0]).bias


@pytest.mark.skipif(packing_supported(), reason="this CPU can prepack bf16 weights")
def test_where_the_cpu_cannot_pack_the_copy_is_refused_with_the_reason():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8)).to(torch.bfloat16).eval()
    with pytest.raises(RuntimeError, match="cannot prepack bf16 weights"):
        with_packed_linears(model)
