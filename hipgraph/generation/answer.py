"""``answer()``: retrieve → build cited context → generate → parse, with abstention.

The answer prompt (``prompts/answer.json``) asks for ``{"answer", "citations", "sufficient"}``.
A reply of that shape (after repairing fences and similar noise) is a structured answer
(``usage["format"] == "json"``). Any other non-empty reply - prose from a model without JSON
mode, JSON of another shape or with a mistyped field - becomes a prose answer by default
(``usage["format"] == "prose"``, a warning logged): the stripped reply is the text, and its
``[n]`` / ``[n, m]`` markers that number a passage of the context are the citations (first
appearance order, duplicates and out-of-range numbers dropped). With
``GeneratorConfig(strict_json=True)`` such a reply is a :class:`GenerationError` naming the
fault instead. An empty reply is an error either way. ``sufficient: false`` or an empty answer
sets ``Answer.abstained`` so applications can fall back instead of showing a guess.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hipgraph.config import GeneratorConfig
from hipgraph.errors import GenerationError
from hipgraph.generation.base import Generation, Generator
from hipgraph.generation.context import Context, build_context, estimate_tokens
from hipgraph.prompts import load_prompt
from hipgraph.text.json_reply import parse_json_reply
from hipgraph.types import Answer, Hit

logger = logging.getLogger(__name__)

_MARKERS = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)\s*\]")  # [3] or [1, 3]


@dataclass(frozen=True)
class ParsedReply:
    """An answer reply read: its text, cited hits, whether the passages sufficed, and its
    ``format``: ``json`` (the answer schema) or ``prose`` (the fallback)."""

    text: str
    citations: list[Hit]
    sufficient: bool
    format: str


def parse_answer(text: str, context: Context, *, strict_json: bool = False) -> ParsedReply:
    """The reply read as the answer schema, else (unless ``strict_json``) as prose with ``[n]``
    markers; GenerationError when it is empty, or malformed and ``strict_json``."""
    if not isinstance(text, str) or not text.strip():
        raise GenerationError(f"answer reply is empty: {text!r}")
    try:
        answer, citations, sufficient = _parse_json_answer(text, context)
    except GenerationError as exc:
        if strict_json:
            raise
        logger.warning("answer reply is not the JSON answer schema (%s); using it as prose", exc)
        return ParsedReply(text.strip(), context.cited(prose_citations(text)), True, "prose")
    return ParsedReply(answer, citations, sufficient, "json")


def prose_citations(text: str) -> list[int]:
    """The passage numbers of the ``[n]`` and ``[n, m]`` markers in ``text``, in order."""
    return [int(n) for group in _MARKERS.findall(text) for n in group.split(",")]


def _parse_json_answer(text: str, context: Context) -> tuple[str, list[Hit], bool]:
    """``(answer, cited hits, sufficient)`` from a JSON reply; GenerationError when malformed."""
    try:
        data = parse_json_reply(text)
    except ValueError as exc:
        raise GenerationError(f"answer reply is not JSON ({exc}): {text[:200]!r}") from exc
    if not isinstance(data, dict):
        raise GenerationError(f"answer reply must be a JSON object, got {type(data).__name__}")
    answer, citations, sufficient = data.get("answer"), data.get("citations", []), data.get("sufficient")
    if not isinstance(answer, str):
        raise GenerationError(f'answer reply: "answer" must be a string, got {answer!r}')
    if not isinstance(sufficient, bool):
        raise GenerationError(f'answer reply: "sufficient" must be true or false, got {sufficient!r}')
    if not isinstance(citations, list) or not all(isinstance(c, int) and not isinstance(c, bool)
                                                 for c in citations):
        raise GenerationError(f'answer reply: "citations" must be a list of passage numbers, got {citations!r}')
    unknown = [c for c in citations if not 1 <= c <= len(context.hits)]
    if unknown:
        logger.warning("answer cites passages %s that the context does not hold; ignored", unknown)
    return answer.strip(), context.cited(citations), sufficient


def compose(questions: Sequence[str], hits: Sequence[Sequence[Hit]], generator: Generator | None,
            config: GeneratorConfig) -> list[Answer]:
    """Answers for questions whose hits were retrieved already (one generator batch)."""
    count = estimate_tokens
    if generator is not None:
        def count(text: str) -> int:
            n = generator.count_tokens(text)
            return estimate_tokens(text) if n is None else n
    contexts = [build_context(h, config.context_tokens, count=count,
                              include_facts=config.include_facts) for h in hits]
    if generator is None:  # the "none" generator: context only
        return [Answer(question=q, text="", citations=list(c.hits), context=c.text,
                       abstained=False, usage={}, hits=list(h), generator="none")
                for q, c, h in zip(questions, contexts, hits, strict=True)]
    prompt = load_prompt("answer")
    batch = [prompt.render(context=c.text or "(no passages found)", question=q)
             for q, c in zip(questions, contexts, strict=True)]
    replies = generator.generate(batch, max_tokens=config.answer_tokens, json_mode=True)
    answers = []
    for q, c, h, reply in zip(questions, contexts, hits, replies, strict=True):
        try:
            if isinstance(reply, Exception):
                raise GenerationError(f"generator {generator.name} failed for {q!r}: {reply}") from reply
            answers.append(_to_answer(q, c, list(h), reply, generator.name,
                                      config.strict_json))
        except GenerationError as exc:
            if config.on_invalid == "raise":
                raise
            logger.warning("%s", exc)
            answers.append(Answer(question=q, text="", citations=[], context=c.text, abstained=True,
                                  usage={"error": str(exc), "context_tokens": c.tokens},
                                  hits=list(h), generator=generator.name))
    return answers


def _to_answer(question: str, context: Context, hits: list[Hit], reply: Generation,
               name: str, strict_json: bool) -> Answer:
    parsed = parse_answer(reply.text, context, strict_json=strict_json)
    abstained = not parsed.sufficient or not parsed.text
    usage: dict[str, Any] = dict(reply.usage)
    usage["context_tokens"] = context.tokens
    usage["format"] = parsed.format
    return Answer(question=question, text="" if abstained else parsed.text,
                  citations=[] if abstained else parsed.citations, context=context.text,
                  abstained=abstained, usage=usage, hits=hits, generator=name)
