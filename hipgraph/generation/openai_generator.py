"""``openai`` generator: any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, llama.cpp).

Retries with backoff on 429/5xx and time-outs, and bounded concurrency for batches, come from
:class:`hipgraph.models.chat.ChatClient`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hipgraph.config import ChatConfig
from hipgraph.errors import ConfigError
from hipgraph.generation.base import Generation
from hipgraph.models.chat import ChatClient


class OpenAIGenerator:
    """``client``: an existing client for ``chat`` to share (e.g. with the fact filter)."""

    def __init__(self, chat: ChatConfig | None, client: ChatClient | None = None):
        if chat is None:
            raise ConfigError("the openai generator needs a chat config (base_url, model)")
        self._owns_client = client is None
        self.client = client or ChatClient(chat)
        self.name = f"openai:{chat.model}"

    def generate(self, batch: Sequence[Sequence[Mapping[str, Any]]], *, max_tokens: int,
                 json_mode: bool = True) -> list[Generation | Exception]:
        results = self.client.complete_many(batch, json_mode=json_mode, max_tokens=max_tokens,
                                            return_exceptions=True)
        return [r if isinstance(r, Exception) else Generation(text=r.text, usage=dict(r.usage))
                for r in results]

    def count_tokens(self, text: str) -> int | None:
        return None  # the endpoint's tokenizer is not known here: the context uses the estimate

    def close(self) -> None:
        if self._owns_client:
            self.client.close()
