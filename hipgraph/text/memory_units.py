"""The stored form of conversation memory, shared by the indexer that writes it and the retriever.

A session is one document, keyed by :func:`session_key`, whose metadata has ``kind`` =
:data:`SESSION_KIND`, ``conversation``, ``session``, ``time`` (ISO or None), ``turns`` (``[id,
speaker, start, end, time]`` per turn, character spans into the text) and ``units`` (``[start,
end]`` character spans of its memory units). :func:`unit_record` reads one unit back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SESSION_KIND = "conversation_session"


def session_key(conversation_id: str, session_id: str) -> str:
    """The document id of a session: ``<conversation>#<session>``."""
    return f"{conversation_id}#{session_id}"


def unit_turns(metadata: Mapping[str, Any], start: int, end: int) -> list[tuple[int, list[Any]]]:
    """``(position, turn)`` of each turn of a session document whose character span overlaps
    the unit ``[start, end)``, in order (``turn`` as stored: ``[id, speaker, start, end, time]``)."""
    return [(pos, t) for pos, t in enumerate(metadata.get("turns", [])) if t[2] < end and t[3] > start]


def unit_record(metadata: Mapping[str, Any], start: int, end: int) -> dict[str, Any]:
    """The ``Hit`` fields of the unit spanning characters ``[start, end)`` of a session document:
    its turn ids and speakers, conversation, session, and ISO start/end time (its turns' own
    times, else the session's)."""
    session_time = metadata.get("time") or ""
    turns = [t for _, t in unit_turns(metadata, start, end)]
    times = [t[4] or session_time for t in turns if t[4] or session_time]
    return {"turn_ids": tuple(t[0] for t in turns), "speakers": tuple(dict.fromkeys(t[1] for t in turns)),
            "conversation": metadata.get("conversation", ""), "session": metadata.get("session", ""),
            "time": min(times) if times else session_time, "time_end": max(times) if times else session_time}
