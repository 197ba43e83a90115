"""Linear layers on weights prepacked for oneDNN, for the traced question model.

``torch.nn.Linear`` in bf16 on the CPU hands its weight to oneDNN in PyTorch's plain layout, and
oneDNN reorders it into its blocked layout on every call. For a question (about 20 word pieces,
so 20 rows against 384 x 1536 weights) that reordering is a large part of the work. Reordering
each weight once, as TorchInductor does when it freezes a model, cut the traced model's time
for one question from 3.6 to 2.8 ms on one thread (``README``, question embedding). Large
batches gain nothing (measured equal), so the indexing model keeps its plain layers.

The operators are PyTorch's own (``mkldnn::_reorder_linear_weight`` and
``mkldnn::_linear_pointwise``, what Inductor emits). They are internal, so
:func:`with_packed_linears` raises where a torch build lacks them, and the trace built from it
is checked against the eager model like any other. Imported only when a trace is built.
"""

from __future__ import annotations

import copy
import functools

import torch

PACKED_ROWS = 32  # the row count the layout is chosen for: a question's word pieces (16-64 timed equal)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    scalars: list[int | float | complex | None] = []  # no fused activation, so no parameters
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", scalars, "")


@functools.lru_cache(maxsize=1)
def _scripted_linear():
    # scripted, because the tracer cannot record the operator's empty list of optional scalars
    return torch.jit.script(_linear)


class PackedLinear(torch.nn.Module):
    """``linear`` with its weight reordered once into oneDNN's layout (same outputs)."""

    def __init__(self, linear: torch.nn.Linear, rows: int = PACKED_ROWS):
        super().__init__()
        self.register_buffer("packed_weight",
                             torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows))
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _scripted_linear()(x, self.packed_weight, self.bias)


@functools.lru_cache(maxsize=1)
def packing_supported() -> bool:
    """Whether this torch build and CPU can reorder a bf16 weight for oneDNN: the bf16 reorder
    needs AVX512-BW/VL/DQ or AVX-NE-CONVERT, and raises on CPUs with AVX2 only."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=torch.bfloat16), PACKED_ROWS)
    except RuntimeError:
        return False
    return True


def with_packed_linears(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose ``torch.nn.Linear`` layers are :class:`PackedLinear`; every other
    parameter and buffer is shared with ``model``, which is left unchanged. For a CPU model in
    eval mode; raises where this torch build or CPU cannot prepack bf16 weights."""
    if not packing_supported():
        raise RuntimeError("this torch build or CPU cannot prepack bf16 weights for oneDNN "
                           "(it needs oneDNN, and AVX512-BW/VL/DQ or AVX-NE-CONVERT)")
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    clone = copy.deepcopy(model, shared)
    with torch.inference_mode():
        for module in list(clone.modules()):
            for name, child in list(module.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(module, name, PackedLinear(child))
    return clone
