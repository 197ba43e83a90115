"""Numeric dates in conversations: day-first or month-first decided per conversation from all its
dates, an explicit order or strptime format, and a warning when sessions come out of order."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from conftest import cli_in_process, copy_index

from hipgraph.errors import ConfigError, InputError
from hipgraph.indexers.conversations import (
    DateOrder,
    read_conversation_file,
    session_order_warnings,
    to_conversation,
)
from hipgraph.temporal import decide_dayfirst, parse_time


def _conv(*times: str, turn_time: str | None = None) -> dict:
    sessions = [{"id": f"s{i + 1}", "time": t, "turns": [{"speaker": "Ann", "text": f"note {i}"}]}
                for i, t in enumerate(times)]
    if turn_time is not None:
        sessions[-1]["turns"][0]["time"] = turn_time
    return {"id": "chat", "sessions": sessions}


def _times(record: dict, **order) -> list[datetime]:
    return [s.time for s in to_conversation(record, dates=DateOrder(**order)).sessions]


def test_parse_time_reads_numeric_dates_in_the_order_it_is_given():
    assert parse_time("01.02.2024, 10:00:00") == datetime(2024, 1, 2, 10)  # dateutil's default
    assert parse_time("01.02.2024, 10:00:00", dayfirst=True) == datetime(2024, 2, 1, 10)
    assert parse_time("2024-02-01 10:00", dayfirst=True) == datetime(2024, 2, 1, 10)  # ISO: never swapped
    assert parse_time("8 May 2023", dayfirst=True) == datetime(2023, 5, 8)
    assert parse_time("01.02.2024 10:00", date_format="%d.%m.%Y %H:%M") == datetime(2024, 2, 1, 10)
    with pytest.raises(InputError, match=r"t: '2024-02-01' does not match the date format '%d.%m.%Y'"):
        parse_time("2024-02-01", where="t", date_format="%d.%m.%Y")


@pytest.mark.parametrize("times, dayfirst", [
    (["29.12.2023, 22:42:04", "01.02.2024, 10:00:00"], True),   # a first field over 12 settles it
    (["12/30/2023 9:00", "01/02/2024 10:00"], False),           # a second field over 12
    (["01.02.2024", "05.02.2024", "02.03.2024"], True),          # only day-first runs forward
    (["02/01/2024", "02/05/2024", "03/02/2024"], False),         # only month-first runs forward
    (["02.01.2024", "02.05.2024"], True),                        # both forward: dots mean day-first
    (["02/01/2024", "02/05/2024"], False),                       # both forward: slashes month-first
    (["1:56 pm on 8 May, 2023", "2023-05-20"], False),           # no numeric date: nothing to decide
])
def test_the_date_order_is_decided_from_all_of_a_conversations_dates(times, dayfirst):
    assert decide_dayfirst([(f"s{i}", t) for i, t in enumerate(times)], where="c") is dayfirst


def test_a_later_unambiguous_date_decides_the_earlier_ambiguous_ones():
    record = _conv("01.02.2024, 10:00:00", "05.02.2024, 09:00:00", turn_time="13.02.2024, 08:00:00")
    assert _times(record) == [datetime(2024, 2, 1, 10), datetime(2024, 2, 5, 9)]
    assert to_conversation(record).sessions[1].turns[0].time == datetime(2024, 2, 13, 8)
    # the explicit order wins; month-first puts session 2 (2 May) after session 1 (2 January)
    assert _times(record, dayfirst=False) == [datetime(2024, 1, 2, 10), datetime(2024, 5, 2, 9)]
    assert _times(record, date_format="%d.%m.%Y, %H:%M:%S")[0] == datetime(2024, 2, 1, 10)


def test_dates_written_in_both_orders_are_an_error_naming_both():
    with pytest.raises(InputError, match=r"both day-first \('13.01.2024'.*sessions\[0\].time\) and month-first "
                                         r"\('01/13/2024'.*sessions\[1\].time\)"):
        to_conversation(_conv("13.01.2024", "01/13/2024"))
    assert _times(_conv("13.01.2024", "01/13/2024"), date_format=None, dayfirst=True)[0] == datetime(2024, 1, 13)


def test_bad_date_options_are_config_errors():
    for bad in ({"dayfirst": "yes"}, {"date_format": "dd.mm.yyyy"}, {"dayfirst": True, "date_format": "%d"}):
        with pytest.raises(ConfigError):
            DateOrder(**bad)


def test_sessions_out_of_order_are_warned_about():
    conv = to_conversation(_conv("2024-03-01", "2024-02-01", "2024-04-01"))
    [line] = session_order_warnings(conv)
    assert "session 's2' (2024-02-01 00:00) is earlier than session 's1' before it (2024-03-01 00:00)" in line
    assert session_order_warnings(to_conversation(_conv("2024-01-01", "2024-01-01", "2024-02-01"))) == []


def test_the_api_reads_day_first_chats_and_reports_sessions_out_of_order(make_index):
    hg = make_index("memory")
    report = hg.add_conversation(_conv("29.12.2023, 22:42:04", "01.02.2024, 10:00:00"))
    assert not [w for w in report.warnings if "earlier than" in w]
    stored = [json.loads(m) for (m,) in hg.store.con.execute(
        "SELECT metadata FROM documents ORDER BY key").fetchall()]
    assert [m["time"] for m in stored] == ["2023-12-29T22:42:04", "2024-02-01T10:00:00"]
    # read day-first (the only order that runs forward) unless told otherwise: forced month-first,
    # the second session (3 February) comes before the first (1 May) and the report says so
    report = hg.add_conversation({**_conv("05.01.2024", "02.03.2024"), "id": "eu"})
    assert not [w for w in report.warnings if "earlier than" in w]
    report = hg.add_conversation({**_conv("05.01.2024", "02.03.2024"), "id": "us"}, dayfirst=False)
    assert ("conversation 'us': session 's2' (2024-02-03 00:00) is earlier than session 's1' before it "
            "(2024-05-01 00:00)") in " ".join(report.warnings)


def test_the_cli_takes_the_date_order(inline_template, tmp_path, capsys):
    db = str(copy_index(inline_template, tmp_path))
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(_conv("02.01.2024", "02.05.2024")), encoding="utf-8")
    assert [s.time for s in read_conversation_file(path, "conversation")[0][0].sessions] == [
        datetime(2024, 1, 2), datetime(2024, 5, 2)]
    assert cli_in_process("index", "--db", db, "--format", "conversation", "--monthfirst", "--json",
                          str(path)) == 0
    with pytest.raises(SystemExit) as refused:  # argparse refuses the two flags together
        cli_in_process("index", "--db", db, "--format", "conversation", "--dayfirst", "--monthfirst", str(path))
    assert refused.value.code == 2
    times = sorted(json.loads(m)["time"] for (m,) in __import__("duckdb").connect(
        f"{db}/graph.duckdb", read_only=True).execute(
        "SELECT metadata FROM documents WHERE key LIKE 'chat#%'").fetchall())
    assert times == ["2024-02-01T00:00:00", "2024-02-05T00:00:00"]
    capsys.readouterr()
