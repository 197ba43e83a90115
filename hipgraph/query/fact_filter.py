"""Recognition memory (HippoRAG 2): an LLM keeps the candidate facts relevant to the question.

The reply must be ``{"fact": [[subject, relation, object], ...]}``; kept facts are matched back to
the candidates by their normalised triple, anything the model invented is ignored. A request that
fails or a reply that cannot be parsed leaves that question's candidates unfiltered, and the
caller records why in the hits' ``why``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from hipgraph.errors import LLMError
from hipgraph.models.chat import ChatClient
from hipgraph.prompts import load_prompt
from hipgraph.text.json_reply import parse_json_reply
from hipgraph.text.normalize import normalize_entity, normalize_relation

logger = logging.getLogger(__name__)

Triple = tuple[str, str, str]


def _key(triple: Sequence[str]) -> Triple:
    s, r, o = triple
    return normalize_entity(s), normalize_relation(r), normalize_entity(o)


def parse_kept(reply: str, candidates: Sequence[Triple]) -> list[int]:
    """Indexes of the candidates the reply keeps, in candidate order; ``ValueError`` if malformed."""
    data = parse_json_reply(reply)
    if not isinstance(data, dict) or not isinstance(data.get("fact"), list):
        raise ValueError('expected {"fact": [[subject, relation, object], ...]}')
    keys = {_key(c): i for i, c in reversed(list(enumerate(candidates)))}
    kept: set[int] = set()
    for item in data["fact"]:
        if not (isinstance(item, list | tuple) and len(item) == 3 and all(isinstance(x, str) for x in item)):
            raise ValueError(f"a kept fact is not three strings: {item!r}")
        i = keys.get(_key(item))
        if i is None:
            logger.debug("fact filter: ignoring a fact not among the candidates: %r", item)
        else:
            kept.add(i)
    return sorted(kept)


class FactFilter:
    """Runs the ``fact_filter`` prompt for a batch of questions through one chat client."""

    def __init__(self, client: ChatClient):
        self.client = client
        self.prompt = load_prompt("fact_filter")

    def keep(self, questions: Sequence[str], candidates: Sequence[Sequence[Triple]]
             ) -> list[tuple[list[int] | None, str | None]]:
        """Per question ``(kept candidate indexes, None)``, or ``(None, reason)`` on failure."""
        todo = [i for i, c in enumerate(candidates) if c]
        out: list[tuple[list[int] | None, str | None]] = [([], None) for _ in questions]
        batch = [self.prompt.render(question=questions[i],
                                    facts=json.dumps({"fact": [list(t) for t in candidates[i]]}))
                 for i in todo]
        replies = self.client.complete_many(batch, json_mode=True, return_exceptions=True)
        for i, reply in zip(todo, replies, strict=True):
            if isinstance(reply, LLMError):
                logger.warning("fact filter request failed for question %d: %s", i, reply)
                out[i] = (None, f"request failed: {reply}")
                continue
            try:
                out[i] = (parse_kept(reply.text, candidates[i]), None)
            except ValueError as exc:
                logger.warning("fact filter reply for question %d unusable: %s", i, exc)
                out[i] = (None, f"unusable reply: {exc}")
        return out
