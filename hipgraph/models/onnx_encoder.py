"""The MiniLM encoder on ONNX Runtime: exported once from the packaged torch model, checked
against it, cached outside any index folder.

:func:`load_onnx_encoder` exports the model with mean pooling and L2 normalization inside the graph
(``torch.onnx.export``), optionally quantizes it (``int8``: ONNX Runtime's dynamic int8, per
channel), and embeds :data:`PROBE` with both the exported file and the torch model in fp32. The
file is used only when every probe text agrees to a cosine of at least :data:`MIN_AGREEMENT`; the
verdict is kept beside the file, so the check runs once per model, precision and library versions.
The cache lives in ``$HIPGRAPH_CACHE`` (default ``$XDG_CACHE_HOME/hipgraph`` or
``~/.cache/hipgraph``), keyed by the model's weights, the precision, :data:`EXPORTER_VERSION` and
the torch, transformers and onnxruntime versions.

:class:`OnnxEncoder` is safe from many threads at once (``InferenceSession.run`` is), so question
embeddings need no lock: they do not wait behind a batch that another thread is embedding.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hipgraph.models.embedders import encode_padded, pooled_model

logger = logging.getLogger(__name__)

EXPORTER_VERSION = 1
MIN_AGREEMENT = 0.995  # cosine to torch fp32, every probe text
PRECISIONS = ("fp32", "int8")
INPUTS = ("input_ids", "attention_mask", "token_type_ids")

# short questions, names, facts and passages, one over 256 word pieces (truncation is checked too)
PROBE: tuple[str, ...] = (
    "Who was the first president of the association which published Journal of Psychotherapy Integration?",
    "When did Caroline go to the LGBTQ support group?",
    "What year did the band release its second album?",
    "Marie Curie",
    "the Treaty of Westphalia",
    "Ana: I moved to Lisbon last spring, and the new flat is close to the river.",
    "Ben: Did you finish the marathon training plan you started in May?",
    "Paris | capital of | France",
    "Lionel Messi | plays for | Inter Miami",
    "Journal of Psychotherapy Integration\nThe Journal of Psychotherapy Integration is a quarterly "
    "peer-reviewed academic journal published by the American Psychological Association on behalf "
    "of the Society for the Exploration of Psychotherapy Integration.",
    "Ketchikan Gateway Borough\nThe borough seat is the city of Ketchikan, which lies on Revillagigedo "
    "Island; the borough was incorporated in 1963 and covers islands of the Alexander Archipelago.",
    "ok",
    "1987",
    " ".join(["The river flows past the old mill, where the miller once ground wheat for the whole "
              "valley, and the children of the village would gather on its banks each summer."] * 12),
)


def cache_root() -> Path:
    """Where exported models are kept (``$HIPGRAPH_CACHE`` or the user's cache folder)."""
    if os.environ.get("HIPGRAPH_CACHE"):
        return Path(os.environ["HIPGRAPH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hipgraph"


def _versions() -> dict[str, str]:
    import onnxruntime  # noqa: PLC0415
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "onnxruntime": onnxruntime.__version__, "exporter": str(EXPORTER_VERSION)}


def _weights_digest(model_path: Path) -> str:
    """A digest of the model's files, hashed once per process (a later call checks their sizes
    and modification times only)."""
    stats = tuple((name, f.stat().st_size, f.stat().st_mtime_ns) for name in _MODEL_FILES
                  if (f := model_path / name).is_file())
    return _content_digest(model_path, stats)


_MODEL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json")


@functools.lru_cache(maxsize=8)
def _content_digest(model_path: Path, stats: tuple) -> str:
    digest = hashlib.sha256()
    for name, _, _ in stats:
        file = model_path / name
        if file.is_file():
            digest.update(name.encode())
            with file.open("rb") as f:
                while block := f.read(1 << 20):
                    digest.update(block)
    return digest.hexdigest()[:16]


def cache_folder(model_path: Path, precision: str) -> Path:
    """The cache folder of ``model_path`` exported at ``precision`` with these library versions."""
    versions = json.dumps(_versions(), sort_keys=True)
    key = hashlib.sha256(f"{_weights_digest(model_path)}|{precision}|{versions}".encode()).hexdigest()[:16]
    return cache_root() / "onnx" / f"{model_path.name}-{precision}-{key}"


@dataclass(frozen=True)
class Verdict:
    """How the exported file agreed with torch fp32 on :data:`PROBE`."""

    agreement: float  # the lowest cosine over the probe texts
    usable: bool


class OnnxEncoder:
    """Unit-norm sentence embeddings from the exported file (one ``InferenceSession`` per thread
    count; runs need no lock)."""

    def __init__(self, file: Path, tokenizer, *, max_length: int, dimension: int, verdict: Verdict):
        self.file, self.tokenizer, self.verdict = file, tokenizer, verdict
        self.max_length, self.dimension = max_length, dimension
        self._sessions: dict[int, object] = {}
        self._lock = threading.Lock()

    def session(self, threads: int):
        """The session running on ``threads`` intra-op threads (made on first use)."""
        with self._lock:
            if threads not in self._sessions:
                import onnxruntime as ort  # noqa: PLC0415

                options = ort.SessionOptions()
                options.intra_op_num_threads = threads
                options.inter_op_num_threads = 1
                # idle pool threads sleep instead of spinning: the cores go to the other work
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
                self._sessions[threads] = ort.InferenceSession(
                    str(self.file), options, providers=["CPUExecutionProvider"])
            return self._sessions[threads]

    def embed(self, texts: Sequence[str], *, threads: int, batch_tokens: int) -> np.ndarray:
        """Embeddings of ``texts`` (length-sorted batches under ``batch_tokens`` padded tokens)."""
        session = self.session(threads)

        def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            return session.run(None, {"input_ids": ids, "attention_mask": mask,
                                      "token_type_ids": np.zeros_like(ids)})[0]

        return encode_padded(self.tokenizer, texts, run, max_length=self.max_length,
                             batch_tokens=batch_tokens, dimension=self.dimension)


def load_onnx_encoder(model_path: Path, tokenizer, *, precision: str, max_length: int,
                      dimension: int) -> OnnxEncoder:
    """The validated encoder of ``model_path`` at ``precision`` (exported and checked on first
    use). Check ``encoder.verdict.usable`` before using it."""
    if precision not in PRECISIONS:
        raise ValueError(f"onnx precision must be one of {PRECISIONS}, got {precision!r}")
    folder = cache_folder(model_path, precision)
    file, stamp = folder / "model.onnx", folder / "verdict.json"
    verdict = _read_verdict(stamp) if file.is_file() else None
    if verdict is None:
        verdict = _export(model_path, tokenizer, precision, max_length, dimension, folder)
    return OnnxEncoder(file, tokenizer, max_length=max_length, dimension=dimension, verdict=verdict)


def _read_verdict(stamp: Path) -> Verdict | None:
    try:
        data = json.loads(stamp.read_text())
        return Verdict(float(data["agreement"]), bool(data["usable"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _export(model_path: Path, tokenizer, precision: str, max_length: int, dimension: int,
            folder: Path) -> Verdict:
    """Export (and quantize), check against torch fp32 on :data:`PROBE`, and publish the file
    and its verdict atomically (a concurrent export by another process is harmless)."""
    import torch  # noqa: PLC0415
    from transformers import AutoModel  # noqa: PLC0415

    model = pooled_model(AutoModel.from_pretrained(str(model_path), attn_implementation="eager").eval())
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".export-") as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        sample = tokenizer(["a question", "a somewhat longer passage of text"], padding=True,
                           return_tensors="pt")
        kwargs = {name: sample[name] if name in sample else torch.zeros_like(sample["input_ids"])
                  for name in INPUTS}
        axes = {name: {0: "batch", 1: "tokens"} for name in INPUTS} | {"embedding": {0: "batch"}}
        logger.info("exporting %s to ONNX (%s), once", model_path.name, precision)
        # the tracer's warnings (tensor-to-bool conversions, opset notes) concern tracing in
        # general; the probe check below is what says whether this export is usable
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", module=r"torch\.onnx")
            torch.onnx.export(model, (), str(fp32), kwargs=kwargs, input_names=list(INPUTS),
                              output_names=["embedding"], dynamic_axes=axes, opset_version=17,
                              dynamo=False)
        file = fp32
        if precision == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415

            file = Path(tmp) / "int8.onnx"
            quantize_dynamic(str(fp32), str(file), weight_type=QuantType.QInt8, per_channel=True)
        encoder = OnnxEncoder(file, tokenizer, max_length=max_length, dimension=dimension,
                              verdict=Verdict(0.0, False))
        got = encoder.embed(PROBE, threads=1, batch_tokens=max_length * 8)
        with torch.inference_mode():
            enc = tokenizer(list(PROBE), truncation=True, max_length=max_length, padding=True,
                            return_tensors="pt")
            ref = model(enc["input_ids"], enc["attention_mask"],
                        enc.get("token_type_ids", torch.zeros_like(enc["input_ids"]))).numpy()
        agreement = float((got * ref).sum(axis=1).min())
        verdict = Verdict(round(agreement, 6), agreement >= MIN_AGREEMENT)
        (Path(tmp) / "verdict.json").write_text(json.dumps(
            {"agreement": verdict.agreement, "usable": verdict.usable, "min_agreement": MIN_AGREEMENT,
             "precision": precision, "model": model_path.name, **_versions()}, indent=2))
        staged = Path(tmp) / "out"
        staged.mkdir()
        os.replace(file, staged / "model.onnx")
        os.replace(Path(tmp) / "verdict.json", staged / "verdict.json")
        try:
            os.replace(staged, folder)
        except OSError:  # another process published it first: theirs is the same export
            if not (folder / "model.onnx").is_file():
                raise
    logger.info("ONNX %s export of %s: lowest cosine to torch %.5f on %d probe texts (%s)",
                precision, model_path.name, verdict.agreement, len(PROBE),
                "used" if verdict.usable else f"below {MIN_AGREEMENT}, not used")
    return verdict
