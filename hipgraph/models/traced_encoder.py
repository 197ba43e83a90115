"""Small calls (questions) on a traced copy of the torch model, on one-thread helper threads.

Where the embedder runs in bf16 on the CPU (the CPU computes bf16 natively), tracing its model
with TorchScript and freezing it removes most of eager PyTorch's per-operator overhead, and
tracing a copy whose linear layers keep their weights in oneDNN's layout
(:mod:`hipgraph.models.packed_linear`) removes the weight reordering each layer does on every
call. The model then takes about 2.8 ms for one question on one thread, against 3.6 ms for the
plain trace and 4.1-4.3 ms on ONNX Runtime in fp32 (``README``, question embedding). The traced
module computes with the embedder's own weights, so its vectors are the index's:
:func:`build_traced_encoder` embeds :data:`~hipgraph.models.onnx_encoder.PROBE` both ways and
refuses a trace below :data:`MIN_AGREEMENT`.

It runs on helper threads whose OpenMP team is one thread. That setting belongs to each thread,
and it is made through the OpenMP library torch loaded, so the process's torch thread count (what
batches use) is never changed. A question therefore does not wait behind a batch that another
thread embeds under the embedder's lock, and it does not stall at a parallel barrier when another
process holds a core. Where no such library is found, or a helper thread still reports more than
one thread, the trace is not used.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from hipgraph.models.embedders import encode_padded, pooled_model
from hipgraph.models.onnx_encoder import PROBE

logger = logging.getLogger(__name__)

MIN_AGREEMENT = 0.9999  # cosine to the eager model, every probe text (measured: 0.9999998)
MAX_HELPERS = 8  # questions embedded at once (each on one thread)


@functools.lru_cache(maxsize=1)
def _openmp_library():
    """The OpenMP runtime torch uses (``libgomp`` or ``libiomp5`` beside its libraries), or None."""
    import torch  # noqa: PLC0415

    folder = Path(torch.__file__).resolve().parent / "lib"
    for pattern in ("libgomp*.so*", "libiomp5*.so*"):
        for path in sorted(folder.glob(pattern)):
            try:
                return ctypes.CDLL(str(path))
            except OSError:
                continue
    return None


def _one_openmp_thread() -> None:
    """Helper-thread initializer: this thread's OpenMP team becomes one thread."""
    import torch  # noqa: PLC0415

    # torch sets a new thread's OpenMP team size lazily, on its first get_num_threads or parallel
    # region (to the process's count once set_num_threads was called): let that happen first
    torch.get_num_threads()
    library = _openmp_library()
    if library is not None:
        library.omp_set_num_threads(1)


_TRANSFORMERS_LOGGER = "transformers.modeling_utils"


@contextlib.contextmanager
def _quiet(name: str):
    """Log only errors from logger ``name`` inside the block."""
    log = logging.getLogger(name)
    before = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(before)


class TracedEncoder:
    """Unit-norm embeddings from a frozen TorchScript trace, run on one-thread helper threads
    (safe from many threads at once: each call runs on one helper)."""

    def __init__(self, module, tokenizer, *, max_length: int, dimension: int, helpers: int):
        self.module, self.tokenizer = module, tokenizer
        self.max_length, self.dimension = max_length, dimension
        self.agreement = 0.0
        self.packed = False  # linear layers on prepacked oneDNN weights
        self._pool = ThreadPoolExecutor(max_workers=helpers, thread_name_prefix="hipgraph-question",
                                        initializer=_one_openmp_thread)

    def helper_threads(self) -> int:
        """The torch intra-op thread count a helper thread runs with (1 when pinned)."""
        import torch  # noqa: PLC0415

        return self._pool.submit(torch.get_num_threads).result()

    def embed(self, texts: Sequence[str], *, batch_tokens: int) -> np.ndarray:
        return self._pool.submit(self._embed, list(texts), batch_tokens).result()

    def _embed(self, texts: list[str], batch_tokens: int) -> np.ndarray:
        import torch  # noqa: PLC0415

        def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            ids, mask = torch.from_numpy(ids), torch.from_numpy(mask)
            return self.module(ids, mask, torch.zeros_like(ids)).numpy()

        with torch.inference_mode():
            return encode_padded(self.tokenizer, texts, run, max_length=self.max_length,
                                 batch_tokens=batch_tokens, dimension=self.dimension)

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _trace(model, tokenizer):
    """``model`` pooled, traced with TorchScript and frozen."""
    import torch  # noqa: PLC0415

    sample = tokenizer(["a question", "a somewhat longer question about a passage"],
                       padding=True, return_tensors="pt")
    # tracing reads every attribute of the model, deprecated ones too: their warnings (and
    # transformers' notes on training-only properties) say nothing about this use
    with torch.inference_mode(), warnings.catch_warnings(), _quiet(_TRANSFORMERS_LOGGER):
        for category in (torch.jit.TracerWarning, DeprecationWarning, FutureWarning):
            warnings.filterwarnings("ignore", category=category)
        ids, mask = sample["input_ids"], sample["attention_mask"]
        traced = torch.jit.trace(pooled_model(model), (ids, mask, torch.zeros_like(ids)),
                                 check_trace=False)
        return torch.jit.freeze(traced)


def build_traced_encoder(model, tokenizer, eager: Callable[[list[str]], np.ndarray], *,
                         max_length: int, dimension: int, batch_tokens: int,
                         pack: bool = True) -> TracedEncoder | None:
    """Trace ``model`` (on the CPU, eval mode) and check it against ``eager`` (the embedder's
    own forward) on the probe texts; None, with the reason logged, where it is not used.

    With ``pack``, the trace of a copy whose linear layers run on prepacked weights
    (:mod:`hipgraph.models.packed_linear`) is tried first, and the plain trace where that copy
    cannot be made or disagrees."""
    if _openmp_library() is None:
        logger.info("no OpenMP library beside torch: questions are not embedded on a trace")
        return None
    helpers = max(1, min(MAX_HELPERS, os.cpu_count() or 1))
    reasons = []
    for packed in (True, False) if pack else (False,):
        try:
            if packed:
                from hipgraph.models.packed_linear import with_packed_linears  # noqa: PLC0415

                module = _trace(with_packed_linears(model), tokenizer)
            else:
                module = _trace(model, tokenizer)
        except Exception as exc:  # noqa: BLE001 - other runtimes still embed; the reason is logged
            reasons.append(f"{'packed ' if packed else ''}trace failed: {exc}")
            continue
        encoder = TracedEncoder(module, tokenizer, max_length=max_length, dimension=dimension,
                                helpers=helpers)
        encoder.packed = packed
        threads = encoder.helper_threads()
        if threads != 1:
            logger.info("helper threads run with %d torch threads, not 1: the trace is not used",
                        threads)
            encoder.close()
            return None
        got = encoder.embed(PROBE, batch_tokens=batch_tokens)
        encoder.agreement = float((got * eager(list(PROBE))).sum(axis=1).min())
        if encoder.agreement >= MIN_AGREEMENT:
            logger.info("questions embed on a traced model%s (lowest cosine to eager %.7f on %d "
                        "probe texts)%s", " with prepacked weights" if packed else "",
                        encoder.agreement, len(PROBE), "".join(f"; {r}" for r in reasons))
            return encoder
        encoder.close()
        reasons.append(f"{'packed ' if packed else ''}trace agrees with the eager model only to "
                       f"cosine {encoder.agreement:.6f} (needs {MIN_AGREEMENT:.4f})")
    logger.warning("questions use the other runtimes: %s", "; ".join(reasons))
    return None
