"""LLM parts of decomposed constraint retrieval: decomposition, step reading, query rewriting.

Each uses one packaged prompt (``decompose``, ``step_read``, ``step_rewrite``) with a strict JSON
reply. A failed request or an unusable reply never fails the query: decomposition falls back to
the rule decomposer, reading to graph bridges, rewriting to no retry; each records why.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hipgraph.errors import ExtractionError, LLMError
from hipgraph.models.chat import ChatClient
from hipgraph.prompts import load_prompt
from hipgraph.query.decompose import SLOT, Decomposition, RuleDecomposer, Step, validate_steps
from hipgraph.text.json_reply import parse_json_reply

logger = logging.getLogger(__name__)


def parse_steps(reply: str, question: str, max_steps: int) -> tuple[Step, ...]:
    """Steps from a ``{"steps": [...]}`` reply; ``ValueError`` naming the fault otherwise."""
    data = parse_json_reply(reply)
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
        raise ValueError('expected {"steps": ["sub-question", ...]}')
    texts = data["steps"]
    if not texts or len(texts) > max_steps:
        raise ValueError(f"expected 1 to {max_steps} steps, got {len(texts)}")
    steps = []
    for i, text in enumerate(texts, start=1):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"step {i} is not a non-empty string: {text!r}")
        deps = tuple(sorted({int(k) for k in SLOT.findall(text)}))
        steps.append(Step(text=text.strip(), depends_on=deps))
    try:
        validate_steps(steps, f"LLM decomposition of {question!r}")
    except ExtractionError as exc:
        raise ValueError(str(exc)) from exc
    return tuple(steps)


def format_passages(passages: Sequence[tuple[str, str]]) -> str:
    return "\n".join(f"[{i}] {title}: {text}" if title else f"[{i}] {text}"
                     for i, (title, text) in enumerate(passages, start=1))


class LLMDecomposer:
    """Decomposes questions with the ``decompose`` prompt; ``fallback`` (rules) on failure."""

    name = "llm"

    def __init__(self, client: ChatClient, fallback: RuleDecomposer):
        self.client = client
        self.fallback = fallback
        self.max_steps = fallback.max_steps
        self.prompt = load_prompt("decompose")

    def decompose_many(self, questions: Sequence[str]) -> list[Decomposition]:
        replies = self.client.complete_many([self.prompt.render(question=q) for q in questions],
                                            json_mode=True, return_exceptions=True)
        out: list[Decomposition | None] = []
        failed: list[tuple[int, str]] = []
        for i, (question, reply) in enumerate(zip(questions, replies, strict=True)):
            try:
                if isinstance(reply, LLMError):
                    raise ValueError(f"request failed: {reply}")
                steps = parse_steps(reply.text, question, self.max_steps)
                out.append(Decomposition(question, steps, source="llm" if len(steps) > 1 else "single"))
            except ValueError as exc:
                logger.warning("LLM decomposition of question %d unusable (%s); using rules", i, exc)
                out.append(None)
                failed.append((i, str(exc)))
        if failed:
            rules = self.fallback.decompose_many([questions[i] for i, _ in failed])
            for (i, reason), dec in zip(failed, rules, strict=True):
                out[i] = Decomposition(dec.question, dec.steps, dec.source,
                                       (*dec.notes, f"LLM decomposition failed ({reason}); used rules"))
        return out  # type: ignore[return-value]


class StepReader:
    """Asks the LLM for a step's short answer (``step_read``) and for a better query
    (``step_rewrite``) when the step's passages do not hold it."""

    def __init__(self, client: ChatClient):
        self.client = client
        self.read_prompt = load_prompt("step_read")
        self.rewrite_prompt = load_prompt("step_rewrite")

    def read_many(self, items: Sequence[tuple[str, str, Sequence[tuple[str, str]]]]
                  ) -> list[tuple[str | None, bool | None]]:
        """Per ``(question, step, passages)``: ``(short answer or None, sufficient)``, or
        ``(None, None)`` where the LLM failed."""
        batch = [self.read_prompt.render(question=q, step=step, passages=format_passages(passages))
                 for q, step, passages in items]
        replies = self.client.complete_many(batch, json_mode=True, return_exceptions=True)
        out: list[tuple[str | None, bool | None]] = []
        for (_, step, _), reply in zip(items, replies, strict=True):
            try:
                if isinstance(reply, LLMError):
                    raise ValueError(f"request failed: {reply}")
                data = parse_json_reply(reply.text)
                if not isinstance(data, dict) or not isinstance(data.get("sufficient"), bool) \
                        or not isinstance(data.get("answer", ""), str):
                    raise ValueError('expected {"answer": str, "sufficient": bool}')
            except ValueError as exc:
                logger.warning("step reading failed for %r: %s", step, exc)
                out.append((None, None))
                continue
            answer = data.get("answer", "").strip()
            sufficient = data["sufficient"] and bool(answer)
            out.append(((answer if sufficient else None), sufficient))
        return out

    def rewrite(self, question: str, step: str, passages: Sequence[tuple[str, str]]) -> str | None:
        """A rewritten query for ``step``, or None when the LLM failed."""
        messages = self.rewrite_prompt.render(question=question, step=step,
                                              passages=format_passages(passages))
        try:
            data = parse_json_reply(self.client.complete(messages, json_mode=True).text)
            if not isinstance(data, dict) or not isinstance(data.get("query"), str) \
                    or not data["query"].strip():
                raise ValueError('expected {"query": "..."}')
        except (LLMError, ValueError) as exc:
            logger.warning("query rewrite failed for %r: %s", step, exc)
            return None
        return data["query"].strip()
