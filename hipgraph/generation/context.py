"""Ranked hits → numbered, cited context (``[1] Title: text``) within a token budget.

Tokens are counted with the target model's tokenizer when the generator knows it, otherwise
estimated as 1.3 tokens per word or punctuation mark (``\\w+|[^\\w\\s]``), which over-counts
English for BPE/WordPiece vocabularies slightly, so the budget is kept.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from hipgraph.types import Hit

_WORDS = re.compile(r"\w+|[^\w\s]")
TOKENS_PER_WORD = 1.3

TokenCounter = Callable[[str], int]


def estimate_tokens(text: str) -> int:
    """Documented estimate: ceil(1.3 x words-and-punctuation)."""
    return math.ceil(len(_WORDS.findall(text)) * TOKENS_PER_WORD)


@dataclass(frozen=True)
class Context:
    """The text handed to a generator and the hits it cites, numbered from 1 in order."""

    text: str
    hits: tuple[Hit, ...]
    tokens: int
    truncated: bool  # a passage was cut or left out for the budget

    def cited(self, numbers: Sequence[int]) -> list[Hit]:
        """Hits for citation numbers (1-based), in the given order, unknown numbers skipped."""
        out, seen = [], set()
        for n in numbers:
            if 1 <= n <= len(self.hits) and n not in seen:
                seen.add(n)
                out.append(self.hits[n - 1])
        return out


def _facts(hits: Sequence[Hit]) -> list[str]:
    """The distinct facts retrieval recorded in the hits' ``why``: graph mode's seed facts and
    the verified subgraph facts each passage supports (expand mode)."""
    seen: dict[tuple[str, str, str], None] = {}
    for hit in hits:
        why = hit.why if isinstance(hit.why, dict) else {}
        for f in why.get("seed_facts", []):
            key = (str(f.get("subject", "")), str(f.get("relation", "")), str(f.get("object", "")))
            if all(key):
                seen.setdefault(key, None)
        for f in why.get("supports", []):
            if isinstance(f, list | tuple) and len(f) == 3 and all(f):
                seen.setdefault((str(f[0]), str(f[1]), str(f[2])), None)
    return [f"- {s} | {r} | {o}" for s, r, o in seen]


def _date(iso: str) -> str:
    """A memory hit's day (``8 May 2023``) from its ISO time; "" without one."""
    if not iso:
        return ""
    try:
        return datetime.fromisoformat(iso).strftime("%-d %B %Y")
    except ValueError:
        return ""


def _cut(text: str, budget: int, count: TokenCounter) -> str:
    """The longest word-boundary prefix of ``text`` within ``budget`` tokens (binary search)."""
    words = text.split()
    lo, hi = 0, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(" ".join(words[:mid]) + " ...") <= budget:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo]) + " ..." if lo else ""


def build_context(hits: Sequence[Hit], max_tokens: int, *, count: TokenCounter = estimate_tokens,
                  include_facts: bool = True) -> Context:
    """Number de-duplicated hits as ``[n] Title: text`` until ``max_tokens`` is reached; a
    conversation memory hit without a title is headed by its day (``[n] 8 May 2023: Ana: ...``),
    and the turn hits of one unit are distinct hits.

    A passage that does not fit whole is cut at a word boundary when at least a quarter of the
    budget is left, otherwise left out; later passages are not considered (ranks stay in order).
    With ``include_facts``, the seed facts of graph retrieval follow as a short list, if they fit.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    blocks: list[str] = []
    kept: list[Hit] = []
    seen_ids: set[tuple[int, tuple[str, ...]]] = set()
    seen_texts: set[str] = set()
    used = 0
    truncated = False
    for hit in hits:
        norm = " ".join(hit.text.split())
        key = (hit.passage_id, hit.turn_ids)  # turn hits of one memory unit share its passage
        if key in seen_ids or norm in seen_texts:
            continue
        seen_ids.add(key)
        seen_texts.add(norm)
        n = len(kept) + 1
        label = hit.title or _date(hit.time)
        head = f"[{n}] {label}: " if label else f"[{n}] "
        block = head + norm
        cost = count(block) + (1 if blocks else 0)
        if used + cost > max_tokens:
            left = max_tokens - used - (1 if blocks else 0) - count(head)
            truncated = True
            if left >= max_tokens // 4:
                body = _cut(norm, left, count)
                if body:
                    blocks.append(head + body)
                    kept.append(hit)
                    used += count(head + body) + (1 if len(blocks) > 1 else 0)
            break
        blocks.append(block)
        kept.append(hit)
        used += cost
    text = "\n".join(blocks)
    if include_facts and kept:
        facts = _facts(kept)
        if facts:
            section = "Facts from the knowledge graph:\n" + "\n".join(facts)
            if used + count(section) + 2 <= max_tokens:
                text += "\n\n" + section
                used += count(section) + 2
            else:
                truncated = True
    return Context(text=text, hits=tuple(kept), tokens=used, truncated=truncated)
