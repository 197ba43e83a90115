"""Versioned prompt templates shipped as JSON files next to this module.

Each ``<name>.json`` holds ``{"version", "system", "user"}``; ``{field}`` placeholders (a bare
identifier in braces) are filled by :meth:`Prompt.render`, other braces are left alone, so the
templates can show JSON examples verbatim.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from hipgraph.errors import ConfigError

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Prompt:
    """A chat prompt: a system message and a user message template."""

    name: str
    version: str
    system: str
    user: str

    @property
    def fields(self) -> frozenset[str]:
        """Placeholder names used by the templates."""
        return frozenset(_PLACEHOLDER.findall(self.system) + _PLACEHOLDER.findall(self.user))

    def render(self, **fields: Any) -> list[dict[str, str]]:
        """Chat messages with every placeholder filled; a missing field raises ConfigError."""
        missing = sorted(self.fields - fields.keys())
        if missing:
            raise ConfigError(f"prompt {self.name!r} needs field(s) {missing}")
        values = {key: str(value) for key, value in fields.items()}

        def fill(template: str) -> str:
            # One pass: text substituted in is never scanned for placeholders again.
            return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)

        messages = []
        if self.system:
            messages.append({"role": "system", "content": fill(self.system)})
        messages.append({"role": "user", "content": fill(self.user)})
        return messages


@functools.cache
def load_prompt(name: str) -> Prompt:
    """Load the packaged prompt ``name`` (e.g. ``"ner"``, ``"triples"``)."""
    if not _NAME.match(name):
        raise ConfigError(f"invalid prompt name {name!r}")
    resource = resources.files(__name__).joinpath(f"{name}.json")
    try:
        raw = resource.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError) as exc:
        raise ConfigError(f"no prompt named {name!r}") from exc
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"prompt {name!r} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"prompt {name!r} must be a JSON object")
    for key in ("version", "user"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise ConfigError(f"prompt {name!r} needs a non-empty string {key!r}")
    system = data.get("system", "")
    if not isinstance(system, str):
        raise ConfigError(f"prompt {name!r}: 'system' must be a string")
    return Prompt(name=name, version=data["version"], system=system, user=data["user"])
