"""Time-aware ranking of conversation memory units.

A question's time expression resolves against its question date into a range
(:func:`hipgraph.temporal.resolve_range`); units whose time span overlaps it move ahead of the
others (``boost``, order kept within each group) or are the only ones kept (``filter``). With
``as_of``, units from after that moment are dropped, so memory shows what it held then. Passages
that are not conversation units carry no time: ``as_of`` keeps them, a range never matches them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

from hipgraph.query.hits import Ranked
from hipgraph.temporal import TimeRange


def apply_time(ranked: Ranked, times: dict[int, tuple[datetime, datetime]], span: TimeRange | None,
               as_of: datetime | None, mode: str) -> Ranked:
    """``ranked`` reordered/filtered by time (see module docstring); ``times``: unit -> (start, end)."""
    if as_of is not None:
        ranked = [r for r in ranked if r[0] not in times or times[r[0]][0] <= as_of]
    if span is None or mode == "off":
        return ranked
    inside, outside = [], []
    for pid, score, why in ranked:
        t = times.get(pid)
        if t is not None and t[0] < span.end and t[1] >= span.start:
            inside.append((pid, score, {**why, "time_match": span.expression}))
        else:
            outside.append((pid, score, why))
    if mode == "filter" and inside:
        return inside
    return inside + outside


_PAST = re.compile(r"\b(used to|previously|formerly|originally|at first|at the time|back then|"
                   r"before (?:moving|that|then)|in the past|did .{0,40}\bbefore)\b", re.IGNORECASE)


def asks_about_past(question: str, span: TimeRange | None, question_date: datetime | None) -> bool:
    """Whether a question asks how things were rather than how they are: past markers ("used
    to", "previously") or a time range (``span``, resolved already) ending before the question date."""
    if _PAST.search(question):
        return True
    return span is not None and span.end <= (question_date or datetime.now())


def parse_question_dates(dates: Sequence[object] | None, n: int, parse) -> list[datetime | None]:
    """One parsed question date per question (``dates`` may be None or hold None)."""
    if dates is None:
        return [None] * n
    if len(dates) != n:
        from hipgraph.errors import ConfigError  # noqa: PLC0415

        raise ConfigError(f"question_dates has {len(dates)} entries for {n} questions")
    return [None if d is None else parse(d, where=f"question_dates[{i}]") for i, d in enumerate(dates)]
