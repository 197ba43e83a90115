"""The generator protocol: chat messages in, text out (batched), and an optional tokenizer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Generation:
    """One generated reply and its token usage (``prompt_tokens``, ``completion_tokens``)."""

    text: str
    usage: dict[str, Any] = field(default_factory=dict)


class Generator(Protocol):
    """A backend that completes chat message lists; ``name`` is saved in results."""

    name: str

    def generate(self, batch: Sequence[Sequence[Mapping[str, Any]]], *, max_tokens: int,
                 json_mode: bool = True) -> list[Generation | Exception]:
        """One reply per message list, in order; a failed item holds its exception."""
        ...

    def count_tokens(self, text: str) -> int | None:
        """Tokens of ``text`` for the target model, or None when its tokenizer is unknown."""
        ...

    def close(self) -> None:
        ...
