"""hipgraph.temporal: parsing stored times and resolving a question's time expressions.

Pure functions, no index. Every expected range is a half-open ``[start, end)`` worked out by hand
from the calendar (2023-08-20, the usual question date here, is a Sunday; weeks start on Monday;
2024 is a leap year).
"""

from __future__ import annotations

import dataclasses
from datetime import date, datetime, timedelta, timezone

import pytest

from hipgraph.errors import InputError
from hipgraph.temporal import EventRelative, TimeRange, event_relative, parse_time, resolve_range

SUNDAY = datetime(2023, 8, 20, 15, 0)  # the question date of most cases below
MONDAY = datetime(2023, 8, 21, 9, 30)
EARLIEST = datetime(1, 1, 1)
LATEST = datetime(9999, 12, 31)


def d(text: str) -> datetime:
    return datetime.fromisoformat(text)


# ------------------------------------------------------------------ parse_time
@pytest.mark.parametrize(("value", "expected"), [
    # the free-text formats conversation files write
    ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56)),
    ("10:30 am on 1 January, 2024", datetime(2024, 1, 1, 10, 30)),
    ("May 8, 2023 at 10:00", datetime(2023, 5, 8, 10, 0)),
    ("2023/05/20 (Sat) 02:21", datetime(2023, 5, 20, 2, 21)),
    ("2023/05/20 (Saturday) 02:21", datetime(2023, 5, 20, 2, 21)),
    # ISO 8601; an offset is dropped, the stated local (wall) time is kept
    ("2023-05-08", datetime(2023, 5, 8)),
    ("2023-05-08 10:00", datetime(2023, 5, 8, 10, 0)),
    ("2023-05-08T10:00:00", datetime(2023, 5, 8, 10, 0)),
    ("2023-05-08T10:00:00+02:00", datetime(2023, 5, 8, 10, 0)),
    ("2023-05-08T23:30:00-05:00", datetime(2023, 5, 8, 23, 30)),
    ("2023-05-08T10:00:00Z", datetime(2023, 5, 8, 10, 0)),
    # missing fields come from a fixed default (2000-01-01), never from today
    ("May 2023", datetime(2023, 5, 1)),
    ("2023", datetime(2023, 1, 1)),
    ("8 May", datetime(2000, 5, 8)),
])
def test_parse_time_reads_the_documented_formats(value, expected):
    got = parse_time(value)
    assert got == expected and got.tzinfo is None


def test_parse_time_takes_datetimes_and_dates():
    naive = datetime(2023, 5, 8, 10, 0, 30)
    assert parse_time(naive) == naive
    aware = datetime(2023, 5, 8, 23, 30, tzinfo=timezone(timedelta(hours=-5)))
    got = parse_time(aware)
    assert got == datetime(2023, 5, 8, 23, 30) and got.tzinfo is None  # wall time, not UTC
    day = parse_time(date(2024, 2, 29))
    assert type(day) is datetime and day == datetime(2024, 2, 29, 0, 0)


@pytest.mark.parametrize("value", [None, 20230508, "", "   "])
def test_parse_time_rejects_non_strings_and_blanks_naming_where(value):
    with pytest.raises(InputError, match=r"^sessions\[2\]\.time: expected a date/time string, got "):
        parse_time(value, where="sessions[2].time")


@pytest.mark.parametrize("value", ["next blue moon", "99999999999999999999999"])
def test_parse_time_unreadable_text_names_where_and_value(value):
    with pytest.raises(InputError, match=rf"^turns\[3\]\.time: cannot read '{value}' as a date/time$"):
        parse_time(value, where="turns[3].time")
    with pytest.raises(InputError, match=r"^time: cannot read"):  # the default ``where``
        parse_time(value)


# ------------------------------------------------------------------ TimeRange
def test_time_range_is_half_open_and_serializes():
    span = TimeRange(d("2023-05-01"), d("2023-06-01"), "May 2023")
    tick = timedelta(microseconds=1)
    assert span.contains(d("2023-05-01")) and span.contains(d("2023-06-01") - tick)
    assert not span.contains(d("2023-06-01")) and not span.contains(d("2023-05-01") - tick)
    assert span.to_dict() == {"start": "2023-05-01T00:00:00", "end": "2023-06-01T00:00:00",
                              "expression": "May 2023"}


def test_ranges_and_event_anchors_are_immutable_values():
    span = TimeRange(d("2023-05-01"), d("2023-06-01"), "May 2023")
    ev = EventRelative("the trip", -1, 14, "two weeks before the trip")
    for value, field in ((span, "end"), (ev, "offset_days")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, None)
    assert {span, TimeRange(d("2023-05-01"), d("2023-06-01"), "May 2023")} == {span}
    assert {ev, EventRelative("the trip", -1, 14, "two weeks before the trip")} == {ev}


# ------------------------------------------------------------------ resolve_range
RANGES = [
    # (question, question date, start, end, expression)
    # yesterday / today / tonight: the calendar day
    ("What did Ana do yesterday?", SUNDAY, "2023-08-19", "2023-08-20", "yesterday"),
    ("Yesterday, what did Ana do?", SUNDAY, "2023-08-19", "2023-08-20", "Yesterday"),
    ("What is Ana doing today?", SUNDAY, "2023-08-20", "2023-08-21", "today"),
    ("Where is Ana going tonight?", SUNDAY, "2023-08-20", "2023-08-21", "tonight"),
    ("What did Ana do yesterday?", d("2024-03-01 08:00"), "2024-02-29", "2024-03-01", "yesterday"),
    ("What did Ana do yesterday?", d("2023-01-01 08:00"), "2022-12-31", "2023-01-01", "yesterday"),
    # last/past/previous/this/next day|week|month|year: calendar units, weeks from Monday
    ("What did Ana do the previous day?", SUNDAY, "2023-08-19", "2023-08-20", "previous day"),
    ("What will Ana do the next day?", SUNDAY, "2023-08-21", "2023-08-22", "next day"),
    ("What happened last week?", SUNDAY, "2023-08-07", "2023-08-14", "last week"),
    ("What happened the past week?", SUNDAY, "2023-08-07", "2023-08-14", "past week"),
    ("What happened the previous week?", SUNDAY, "2023-08-07", "2023-08-14", "previous week"),
    ("What happens this week?", SUNDAY, "2023-08-14", "2023-08-21", "this week"),
    ("What happens next week?", SUNDAY, "2023-08-21", "2023-08-28", "next week"),
    ("What happened last week?", MONDAY, "2023-08-14", "2023-08-21", "last week"),
    ("What happens this week?", MONDAY, "2023-08-21", "2023-08-28", "this week"),
    ("What did Ana do last month?", SUNDAY, "2023-07-01", "2023-08-01", "last month"),
    ("What did Ana do the past month?", SUNDAY, "2023-07-01", "2023-08-01", "past month"),
    ("What did Ana do the previous month?", SUNDAY, "2023-07-01", "2023-08-01", "previous month"),
    ("What does Ana do this month?", SUNDAY, "2023-08-01", "2023-09-01", "this month"),
    ("What will Ana do next month?", SUNDAY, "2023-09-01", "2023-10-01", "next month"),
    ("What did Ana do last month?", d("2024-01-15"), "2023-12-01", "2024-01-01", "last month"),
    ("What did Ana do last month?", d("2023-03-31"), "2023-02-01", "2023-03-01", "last month"),
    ("What does Ana do this month?", d("2023-12-15"), "2023-12-01", "2024-01-01", "this month"),
    ("What will Ana do next month?", d("2023-12-15"), "2024-01-01", "2024-02-01", "next month"),
    ("What did Ana do last year?", SUNDAY, "2022-01-01", "2023-01-01", "last year"),
    ("What did Ana do the previous year?", SUNDAY, "2022-01-01", "2023-01-01", "previous year"),
    ("What does Ana do this year?", SUNDAY, "2023-01-01", "2024-01-01", "this year"),
    ("What will Ana do next year?", SUNDAY, "2024-01-01", "2025-01-01", "next year"),
    ("What did Ana do last year?", d("2024-01-15"), "2023-01-01", "2024-01-01", "last year"),
    ("What did Ana do last year?", d("2024-02-29"), "2023-01-01", "2024-01-01", "last year"),
    # N units ago: the calendar unit that contains the shifted date
    ("What did they do two weeks ago?", SUNDAY, "2023-07-31", "2023-08-07", "two weeks ago"),
    ("What did they do a couple of weeks ago?", SUNDAY, "2023-07-31", "2023-08-07",
     "a couple of weeks ago"),
    ("What did Ana buy 5 days ago?", SUNDAY, "2023-08-15", "2023-08-16", "5 days ago"),
    ("What did Ana buy a few days ago?", SUNDAY, "2023-08-17", "2023-08-18", "a few days ago"),
    ("Where was Ana 3 months ago?", SUNDAY, "2023-05-01", "2023-06-01", "3 months ago"),
    ("Where was Ana a month ago?", d("2023-03-31"), "2023-02-01", "2023-03-01", "a month ago"),
    ("Where was Ana one month ago?", d("2024-01-10"), "2023-12-01", "2024-01-01", "one month ago"),
    ("Where was Ana a year ago?", SUNDAY, "2022-01-01", "2023-01-01", "a year ago"),
    ("Where was Ana two years ago?", SUNDAY, "2021-01-01", "2022-01-01", "two years ago"),
    ("Where was Ana a day ago?", d("2024-03-01"), "2024-02-29", "2024-03-01", "a day ago"),
    # in the last N units: from N units before the question day to the end of that day
    ("What did he do in the last 3 months?", SUNDAY, "2023-05-20", "2023-08-21",
     "in the last 3 months"),
    ("What did he do over the past 2 weeks?", SUNDAY, "2023-08-06", "2023-08-21", "the past 2 weeks"),
    ("What did he do during the last 10 days?", SUNDAY, "2023-08-10", "2023-08-21",
     "during the last 10 days"),
    ("What did he do in the last two years?", SUNDAY, "2021-08-20", "2023-08-21",
     "in the last two years"),
    ("What did he do in the last 3 months?", d("2024-01-31"), "2023-10-31", "2024-02-01",
     "in the last 3 months"),
    # a month shift lands on the last day of a shorter month (February, leap or not)
    ("What did he do in the last 2 months?", d("2023-04-30"), "2023-02-28", "2023-05-01",
     "in the last 2 months"),
    ("What did he do in the last 2 months?", d("2024-04-30"), "2024-02-29", "2024-05-01",
     "in the last 2 months"),
    ("What did he do in the last 2 years?", d("2024-02-29"), "2022-02-28", "2024-03-01",
     "in the last 2 years"),
    # last/this/next <month>: "last" is the latest such month before the question's month
    ("Where did she go last May?", SUNDAY, "2023-05-01", "2023-06-01", "last May"),
    ("Where did she go last August?", SUNDAY, "2022-08-01", "2022-09-01", "last August"),
    ("Where did she go last September?", SUNDAY, "2022-09-01", "2022-10-01", "last September"),
    ("Where did she go last Dec?", d("2024-01-05"), "2023-12-01", "2024-01-01", "last Dec"),
    ("Where did she go this May?", SUNDAY, "2023-05-01", "2023-06-01", "this May"),
    ("Where will she go this September?", SUNDAY, "2023-09-01", "2023-10-01", "this September"),
    ("Where will she go next May?", SUNDAY, "2024-05-01", "2024-06-01", "next May"),
    ("Where will she go next August?", SUNDAY, "2024-08-01", "2024-09-01", "next August"),
    ("Where will she go next September?", SUNDAY, "2023-09-01", "2023-10-01", "next September"),
    ("Where will she go next January?", d("2023-12-20"), "2024-01-01", "2024-02-01", "next January"),
    # a calendar day
    ("What happened on 8 May 2023?", SUNDAY, "2023-05-08", "2023-05-09", "8 May 2023"),
    ("What happened on 8th May, 2023?", SUNDAY, "2023-05-08", "2023-05-09", "8th May, 2023"),
    ("What happened on 31 December 2023?", SUNDAY, "2023-12-31", "2024-01-01", "31 December 2023"),
    ("What happened on 29 February 2024?", SUNDAY, "2024-02-29", "2024-03-01", "29 February 2024"),
    ("What did he do on May 7, 2023?", SUNDAY, "2023-05-07", "2023-05-08", "May 7, 2023"),
    ("What did he do on March 1st 2024?", SUNDAY, "2024-03-01", "2024-03-02", "March 1st 2024"),
    # an impossible day falls back to its month
    ("What happened on 29 February 2023?", SUNDAY, "2023-02-01", "2023-03-01", "February 2023"),
    # a month of a year
    ("What did he buy in May 2023?", SUNDAY, "2023-05-01", "2023-06-01", "May 2023"),
    ("What did he buy in May of 2022?", SUNDAY, "2022-05-01", "2022-06-01", "May of 2022"),
    ("What did he buy in December 2023?", SUNDAY, "2023-12-01", "2024-01-01", "December 2023"),
    ("What did he buy in Feb, 2024?", SUNDAY, "2024-02-01", "2024-03-01", "Feb, 2024"),
    # a year (four digits, 1000 to 9998)
    ("What did she do in 2022?", SUNDAY, "2022-01-01", "2023-01-01", "in 2022"),
    ("What did she do during 2021?", SUNDAY, "2021-01-01", "2022-01-01", "during 2021"),
    ("What was built in 1000?", SUNDAY, "1000-01-01", "1001-01-01", "in 1000"),
    ("What will happen in 9998?", SUNDAY, "9998-01-01", "9999-01-01", "in 9998"),
    # in <month>: the latest such month not after the question date
    ("What did she do in July?", SUNDAY, "2023-07-01", "2023-08-01", "in July"),
    ("What did she do in August?", SUNDAY, "2023-08-01", "2023-09-01", "in August"),
    ("What did she do in September?", SUNDAY, "2022-09-01", "2022-10-01", "in September"),
    ("What did she do during December?", d("2024-01-05"), "2023-12-01", "2024-01-01",
     "during December"),
    ("What did she do in January?", d("2024-01-05"), "2024-01-01", "2024-02-01", "in January"),
    # since/after: up to the end of the question day; before: up to the start; until/by: the end
    ("What has she painted since 2022?", SUNDAY, "2022-01-01", "2023-08-21", "since 2022"),
    ("Since 2022, what has she painted?", SUNDAY, "2022-01-01", "2023-08-21", "Since 2022"),
    ("What has she painted after 2022?", SUNDAY, "2023-01-01", "2023-08-21", "after 2022"),
    ("What has she painted since May 2023?", SUNDAY, "2023-05-01", "2023-08-21", "May 2023"),
    ("What has she painted after May 2023?", SUNDAY, "2023-06-01", "2023-08-21", "May 2023"),
    ("What has she painted since last week?", SUNDAY, "2023-08-07", "2023-08-21", "last week"),
    ("What has she planned since this year?", SUNDAY, "2023-01-01", "2024-01-01", "this year"),
    ("What did she do before 2022?", SUNDAY, "0001-01-01", "2022-01-01", "before 2022"),
    ("What did she do before June 2023?", SUNDAY, "0001-01-01", "2023-06-01", "June 2023"),
    ("What did she do until 2022?", SUNDAY, "0001-01-01", "2023-01-01", "until 2022"),
    ("What did she finish by 2022?", SUNDAY, "0001-01-01", "2023-01-01", "by 2022"),
    ("What did she do until last week?", SUNDAY, "0001-01-01", "2023-08-14", "last week"),
]


@pytest.mark.parametrize(("question", "asked", "start", "end", "expression"), RANGES,
                         ids=[f"{r[0]}@{r[1]:%Y-%m-%d}" for r in RANGES])
def test_time_expressions_resolve_to_half_open_ranges(question, asked, start, end, expression):
    assert resolve_range(question, asked) == TimeRange(d(start), d(end), expression)


NUMBER_WORDS = [("a", 1), ("an", 1), ("one", 1), ("two", 2), ("three", 3), ("four", 4),
                ("five", 5), ("six", 6), ("seven", 7), ("eight", 8), ("nine", 9), ("ten", 10),
                ("eleven", 11), ("twelve", 12), ("12", 12), ("a couple of", 2), ("a few", 3)]


@pytest.mark.parametrize(("word", "n"), NUMBER_WORDS)
def test_number_words_count_days_ago(word, n):
    unit = "day" if n == 1 else "days"
    day = datetime(2023, 8, 20 - n)
    assert resolve_range(f"What did Ana do {word} {unit} ago?", SUNDAY) == TimeRange(
        day, day + timedelta(days=1), f"{word} {unit} ago")


@pytest.mark.parametrize("question", [
    "When did Melanie paint a sunrise?",
    "",
    "What happened two weeks before the trip?",  # anchored on an event: see event_relative
    "Will it be done by 0900?",  # a time of day, not a year
    "What will happen in 9999?",  # no year after it to end the range
    "What did he do on February 30, 2023?",  # an impossible day written month first
])
def test_questions_without_a_resolvable_time_give_none(question):
    assert resolve_range(question, SUNDAY) is None


def test_without_a_question_date_expressions_resolve_against_now():
    before = datetime.now()
    span = resolve_range("What did Ana do yesterday?", None)
    after = datetime.now()
    days = {datetime(t.year, t.month, t.day) - timedelta(days=1) for t in (before, after)}
    assert span.start in days and span.end == span.start + timedelta(days=1)


# ------------------------------------------------------------------ event-anchored expressions
@pytest.mark.parametrize(("question", "event", "direction", "offset_days", "expression"), [
    ("What did Ana buy two weeks before the trip?", "the trip", -1, 14, "two weeks before the trip"),
    ("What did Ana buy the two weeks before the trip?", "the trip", -1, 14,
     "the two weeks before the trip"),
    ("What did she do the day after my graduation?", "my graduation", 1, 1,
     "the day after my graduation"),
    ("Who did he meet before the concert?", "the concert", -1, 0, "before the concert"),
    ("Who came after the party and who left?", "the party", 1, 0, "after the party"),
    ("What happened 3 days after the wedding?", "the wedding", 1, 3, "3 days after the wedding"),
    ("What did he pack a month before the move?", "the move", -1, 30, "a month before the move"),
    ("Where did she work a year after her graduation?", "her graduation", 1, 365,
     "a year after her graduation"),
    ("What did they play the week before the concert?", "the concert", -1, 7,
     "the week before the concert"),
    ("What did they fix the month after the move?", "the move", 1, 30, "the month after the move"),
    ("Where did they live the year before the war?", "the war", -1, 365, "the year before the war"),
])
def test_event_relative_expressions(question, event, direction, offset_days, expression):
    assert event_relative(question) == EventRelative(event, direction, offset_days, expression)


def test_questions_without_an_event_anchor():
    assert event_relative("When did Melanie paint a sunrise?") is None
    assert event_relative("What did she do in May 2023?") is None


ANCHOR = datetime(2023, 6, 10, 12, 0)


@pytest.mark.parametrize(("direction", "offset_days", "start", "end"), [
    (-1, 0, EARLIEST, ANCHOR),  # everything before the event
    (1, 0, ANCHOR, LATEST),  # everything after it
    (-1, 14, ANCHOR - timedelta(days=21), ANCHOR - timedelta(days=7)),  # half-width 7 days
    (1, 14, ANCHOR + timedelta(days=7), ANCHOR + timedelta(days=21)),
    (1, 7, ANCHOR + timedelta(days=4), ANCHOR + timedelta(days=10)),  # half-width 7 // 2 = 3
    (-1, 3, ANCHOR - timedelta(days=4), ANCHOR - timedelta(days=2)),  # half-width at least 1 day
    (1, 1, ANCHOR, ANCHOR + timedelta(days=2)),
])
def test_event_relative_ranges_around_the_anchor(direction, offset_days, start, end):
    ev = EventRelative("the trip", direction, offset_days, "around the trip")
    assert ev.resolve(ANCHOR) == TimeRange(start, end, "around the trip")
