"""Times for conversation memory: parsing stored times and resolving time expressions in questions.

:func:`parse_time` reads a point in time from a value as conversation files write it
("1:56 pm on 8 May, 2023", "2023/05/20 (Sat) 02:21", ISO 8601, a ``datetime``). Times are naive
(no time zone): conversations state local times, and comparisons stay within one conversation.

:func:`resolve_range` finds time expressions in a question and resolves them against the question
date into a half-open range ``[start, end)``: "yesterday", "last week/month/year", "this month",
"N days/weeks/months/years ago", "last May", "in May 2023", "in 2023", "on 8 May 2023", "since
2022", "before June 2023". Expressions anchored on events ("two weeks before the trip", "the day
after my graduation") are found by :func:`event_relative`; retrieval looks the event up in memory
and resolves the range around its time.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from hipgraph.errors import InputError
from hipgraph.text.limits import short_repr

_MAX_TIME_CHARS = 200

_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_MONTHS.update({name.lower(): i for i, name in enumerate(calendar.month_abbr) if name})
_MONTH_RE = "|".join(sorted((m for m in _MONTHS if len(m) > 2), key=len, reverse=True))
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
            "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "couple of": 2,
            "few": 3}
_NUM_RE = r"\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|a couple of|a few"
_UNIT_RE = r"day|week|month|year"
_WEEKDAY = re.compile(r"\((mon|tue|wed|thu|fri|sat|sun)[a-z]*\)", re.IGNORECASE)
_EARLIEST = datetime(1, 1, 1)
_LATEST = datetime(9999, 12, 31)


def parse_time(value: object, *, where: str = "time", dayfirst: bool = False,
               date_format: str | None = None) -> datetime:
    """A naive datetime from ``value`` (see module docstring); InputError naming ``where``.

    ``dayfirst`` reads a numeric date such as ``01.02.2024`` as 1 February (else 2 January);
    ``date_format`` (a ``strptime`` format) reads strings in exactly that format and no other.
    """
    if isinstance(value, datetime):
        return value.replace(tzinfo=None)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: expected a date/time string, got {short_repr(value)}")
    if len(value) > _MAX_TIME_CHARS:
        raise InputError(f"{where}: a date/time of {len(value):,} characters (at most {_MAX_TIME_CHARS})")
    if date_format is not None:
        try:
            return datetime.strptime(value.strip(), date_format)
        except ValueError as exc:
            raise InputError(f"{where}: {short_repr(value)} does not match the date format "
                             f"{date_format!r}") from exc
    text = _WEEKDAY.sub(" ", value).replace(" on ", " ").replace(" at ", " ").strip()
    try:
        return datetime.fromisoformat(text).replace(tzinfo=None)
    except ValueError:
        pass
    from dateutil import parser  # noqa: PLC0415 - only for free-text times

    try:
        return parser.parse(text, default=datetime(2000, 1, 1), dayfirst=dayfirst).replace(tzinfo=None)
    except (ValueError, OverflowError) as exc:
        raise InputError(f"{where}: cannot read {short_repr(value)} as a date/time") from exc


_NUMERIC_DATE = re.compile(r"(?<![\d.:/-])(\d{1,2})([./-])(\d{1,2})\2(\d{2}|\d{4})(?![\d/-])")


def decide_dayfirst(values: list[tuple[str, object]], *, where: str) -> bool:
    """Whether the numeric dates among ``values`` (``(where, raw)`` in the order the conversation
    states them) are written day-first, decided from all of them together:

    - a first field over 12 anywhere means day-first, a second field over 12 month-first (both at
      once is an InputError naming the two values);
    - otherwise the order whose times run chronologically with fewer steps backwards wins;
    - a tie (every date ambiguous and both orders chronological): day-first for dates written
      with dots (``01.02.2024``, the European convention), month-first for slashes and dashes.
    """
    day_first = month_first = None
    ambiguous: list[tuple[str, str]] = []
    for at, raw in values:
        if not isinstance(raw, str):
            continue
        for match in _NUMERIC_DATE.finditer(raw):
            first, second = int(match.group(1)), int(match.group(3))
            if first > 12 >= second:
                day_first = day_first or (at, raw)
            elif second > 12 >= first:
                month_first = month_first or (at, raw)
            elif first <= 12 and second <= 12 and first != second:
                ambiguous.append((at, raw))
    if day_first and month_first:
        raise InputError(f"{where}: dates are written both day-first ({day_first[1]!r}, {day_first[0]}) "
                         f"and month-first ({month_first[1]!r}, {month_first[0]}); give the order "
                         "(dayfirst=True/False, CLI --dayfirst/--monthfirst) or a date_format")
    if day_first or month_first:
        return bool(day_first)
    if not ambiguous:
        return False
    strings = [raw for _, raw in values if isinstance(raw, str)]
    backwards = {order: _steps_back(strings, order) for order in (True, False)}
    if backwards[True] != backwards[False]:
        return backwards[True] < backwards[False]
    return "." in _NUMERIC_DATE.search(ambiguous[0][1]).group(2)


def _steps_back(strings: list[str], dayfirst: bool) -> int:
    """How often a time read with ``dayfirst`` is earlier than the one before it (unreadable
    strings are left out; they fail later with their own error)."""
    times = []
    for raw in strings:
        try:
            times.append(parse_time(raw, dayfirst=dayfirst))
        except InputError:
            continue
    return sum(1 for a, b in zip(times, times[1:], strict=False) if b < a)


@dataclass(frozen=True)
class TimeRange:
    """``[start, end)`` with the words of the question it came from."""

    start: datetime
    end: datetime
    expression: str

    def contains(self, t: datetime) -> bool:
        return self.start <= t < self.end

    def to_dict(self) -> dict[str, str]:
        return {"start": self.start.isoformat(), "end": self.end.isoformat(), "expression": self.expression}


def _day(t: datetime) -> datetime:
    return datetime(t.year, t.month, t.day)


def _add_months(t: datetime, months: int) -> datetime:
    y, m = divmod(t.month - 1 + months, 12)
    year, month = t.year + y, m + 1
    return datetime(year, month, min(t.day, calendar.monthrange(year, month)[1]))


def _month(year: int, month: int) -> tuple[datetime, datetime]:
    start = datetime(year, month, 1)
    return start, _add_months(start, 1)


def _span(unit: str, t: datetime) -> tuple[datetime, datetime]:
    """The calendar day/week/month/year that contains ``t``."""
    if unit == "day":
        return _day(t), _day(t) + timedelta(days=1)
    if unit == "week":
        start = _day(t) - timedelta(days=t.weekday())
        return start, start + timedelta(days=7)
    if unit == "month":
        return _month(t.year, t.month)
    return datetime(t.year, 1, 1), datetime(t.year + 1, 1, 1)


def _shift(unit: str, t: datetime, n: int) -> datetime:
    if unit == "day":
        return t + timedelta(days=n)
    if unit == "week":
        return t + timedelta(weeks=n)
    if unit == "month":
        return _add_months(t, n)
    return _add_months(t, 12 * n)


def _number(word: str) -> int:
    word = word.lower().strip()
    return int(word) if word.isdigit() else _NUMBERS[word.removeprefix("a ").strip()
                                                     if word.startswith("a ") else word]


_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b(yesterday|today|tonight)\b", re.I), "day_word"),
    (re.compile(rf"\b(last|this|past|previous|next)\s+({_UNIT_RE})\b", re.I), "relative_unit"),
    (re.compile(rf"\b({_NUM_RE})\s+({_UNIT_RE})s?\s+ago\b", re.I), "ago"),
    (re.compile(rf"\b(?:in|during|past|last|this)?\s*(?:the\s+)?(last|past)\s+({_NUM_RE})\s+({_UNIT_RE})s\b", re.I),
     "last_n"),
    (re.compile(rf"\b(last|this|next)\s+({_MONTH_RE})\b", re.I), "relative_month"),
    (re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+({_MONTH_RE}),?\s+(\d{{4}})\b", re.I), "day_month_year"),
    (re.compile(rf"\b({_MONTH_RE})\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", re.I), "month_day_year"),
    (re.compile(rf"\b({_MONTH_RE}),?\s+(?:of\s+)?(\d{{4}})\b", re.I), "month_year"),
    (re.compile(r"\b(?:in|during|of|since|before|after|until|by)\s+(\d{4})\b", re.I), "year"),
    (re.compile(rf"\b(?:in|during)\s+({_MONTH_RE})\b", re.I), "bare_month"),
]
_OPEN = re.compile(r"\b(since|after|before|until|by)\s*$", re.I)


def resolve_range(question: str, question_date: datetime | None) -> TimeRange | None:
    """The time range a question asks about, or None (see module docstring)."""
    now = question_date or datetime.now()
    for pattern, kind in _RULES:
        m = pattern.search(question)
        if m is None:
            continue
        found = _resolve(kind, m, now)
        if found is None:
            continue
        start, end = found
        opener = _OPEN.search(question[: m.start()]) or (
            re.match(r"\s*(since|after|before|until|by)\b", m.group(0), re.I))
        word = opener.group(1).lower() if opener else ""
        if word in {"since", "after"}:
            start, end = (end if word == "after" else start), max(_day(now) + timedelta(days=1), end)
        elif word in {"before", "until", "by"}:
            start, end = _EARLIEST, (start if word == "before" else end)
        return TimeRange(start, end, m.group(0).strip())
    return None


_UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}
_EVENT = re.compile(
    rf"\b(?:(?:the\s+)?({_NUM_RE})\s+({_UNIT_RE})s?|the\s+({_UNIT_RE}))?\s*\b(before|after)\s+"
    r"((?:the|my|our|his|her|their|a|an)\s+[a-z][\w' -]{2,40}?)(?=[?.,;]|$|\s+(?:and|or|when|did|was|is)\b)",
    re.IGNORECASE)


@dataclass(frozen=True)
class EventRelative:
    """A time expression anchored on an event: "two weeks before the trip"."""

    event: str  # "the trip": looked up in memory for its time
    direction: int  # -1 before, +1 after
    offset_days: int  # 0 when only "before/after the event" is said
    expression: str

    def resolve(self, anchor: datetime) -> TimeRange:
        """The range given the event's time: around the shifted day, or everything before/after."""
        if self.offset_days == 0:
            if self.direction < 0:
                return TimeRange(_EARLIEST, anchor, self.expression)
            return TimeRange(anchor, _LATEST, self.expression)
        center = anchor + timedelta(days=self.direction * self.offset_days)
        half = timedelta(days=max(1, self.offset_days // 2))
        return TimeRange(center - half, center + half, self.expression)


def event_relative(question: str) -> EventRelative | None:
    """The event-anchored time expression of a question, if any (see :class:`EventRelative`)."""
    m = _EVENT.search(question)
    if m is None:
        return None
    n, unit, bare_unit, word, event = m.groups()
    if unit:
        days = _number(n) * _UNIT_DAYS[unit.lower()]
    elif bare_unit:
        days = _UNIT_DAYS[bare_unit.lower()]
    else:
        days = 0
    return EventRelative(event.strip(), -1 if word.lower() == "before" else 1, days, m.group(0).strip())


def _resolve(kind: str, m: re.Match[str], now: datetime) -> tuple[datetime, datetime] | None:
    g = [x.lower() if isinstance(x, str) else x for x in m.groups()]
    if kind == "day_word":
        offset = -1 if g[0] == "yesterday" else 0
        return _span("day", now + timedelta(days=offset))
    if kind == "relative_unit":
        which, unit = g
        step = {"last": -1, "past": -1, "previous": -1, "this": 0, "next": 1}[which]
        return _span(unit, _shift(unit, now, step))
    if kind == "ago":
        n, unit = _number(g[0]), g[1]
        return _span(unit, _shift(unit, now, -n))
    if kind == "last_n":
        n, unit = _number(g[1]), g[2]
        return _shift(unit, _day(now), -n), _day(now) + timedelta(days=1)
    if kind == "relative_month":
        which, month = g[0], _MONTHS[g[1]]
        year = now.year
        if which == "last" and month >= now.month:
            year -= 1
        elif which == "next" and month <= now.month:
            year += 1
        return _month(year, month)
    if kind == "day_month_year":
        try:
            return _span("day", datetime(int(g[2]), _MONTHS[g[1]], int(g[0])))
        except ValueError:
            return None
    if kind == "month_day_year":
        try:
            return _span("day", datetime(int(g[2]), _MONTHS[g[0]], int(g[1])))
        except ValueError:
            return None
    if kind == "month_year":
        return _month(int(g[1]), _MONTHS[g[0]])
    if kind == "year":
        year = int(g[0])
        return (datetime(year, 1, 1), datetime(year + 1, 1, 1)) if 1000 <= year <= 9998 else None
    if kind == "bare_month":  # the latest such month not after the question date
        month = _MONTHS[g[0]]
        year = now.year if month <= now.month else now.year - 1
        return _month(year, month)
    return None
