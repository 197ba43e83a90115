"""Conversations as memory: validated records, file formats, and the documents they are stored as.

A conversation is stored as one document per session (key ``<conversation>#<session>``), so
adding a session is adding a document and deleting one removes exactly what only it produced. The
document's text is its turns as ``Speaker: text`` lines; its chunks are the memory units
(topical segments, turns or the whole session), given as character spans in the metadata, which
also keeps every turn's id, speaker, time and span, so a hit can name the turns it covers.

Formats (``read_conversation_file``):

- ``conversation``: hipgraph's own, ``{"id", "speakers"?, "sessions": [{"id", "time", "turns":
  [{"speaker", "text", "id"?, "time"?}]}]}``, one object, a list of them, or JSONL;
- ``locomo``: LoCoMo (snap-research) as released (``conversation.session_N`` /
  ``session_N_date_time``, ``qa``) or as flattened in the shared data (``conversations: [{"id",
  "speakers", "turns": [{"dia_id", "session", "session_date_time", ...}], "questions"}]``);
- ``longmemeval``: LongMemEval instances (``haystack_sessions``, ``haystack_session_ids``,
  ``haystack_dates``, ``question``, ``question_date``), one conversation per instance.

Each reader also returns the file's questions (for ``hipgraph eval``) as dicts with ``id``,
``question``, ``answer``, ``category``, ``evidence`` (turn ids), ``conversation`` and
``question_date``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hipgraph.errors import ConfigError, InputError
from hipgraph.temporal import decide_dayfirst, parse_time
from hipgraph.text.json_files import read_json_file, read_jsonl_file
from hipgraph.text.limits import MAX_DOCUMENT_CHARS, check_text, short_repr
from hipgraph.text.memory_units import SESSION_KIND, session_key
from hipgraph.types import Conversation, Document, Session, Turn

FORMATS = ("conversation", "locomo", "longmemeval")
_LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


# ------------------------------------------------------------------ validation
@dataclass(frozen=True)
class DateOrder:
    """How a conversation's numeric dates are read: ``dayfirst`` True (``01.02.2024`` is 1
    February) or False (2 January), None to decide per conversation from all its dates
    (:func:`hipgraph.temporal.decide_dayfirst`); ``date_format``, a ``strptime`` format, reads
    every time in exactly that format."""

    dayfirst: bool | None = None
    date_format: str | None = None

    def __post_init__(self) -> None:
        if self.dayfirst is not None and not isinstance(self.dayfirst, bool):
            raise ConfigError(f"dayfirst must be True, False or None, got {self.dayfirst!r}")
        if self.date_format is not None and (not isinstance(self.date_format, str)
                                             or "%" not in self.date_format):
            raise ConfigError(f"date_format must be a strptime format such as '%d.%m.%Y', "
                              f"got {self.date_format!r}")
        if self.dayfirst is not None and self.date_format is not None:
            raise ConfigError("give dayfirst or date_format, not both")

    def reader(self, values: list[tuple[str, Any]], where: str) -> Callable[..., Any]:
        """``parse_time`` with this order settled for the raw ``(where, value)`` times of one
        conversation, in the order it states them."""
        dayfirst = self.dayfirst
        if dayfirst is None and self.date_format is None:
            dayfirst = decide_dayfirst(values, where=where)
        return functools.partial(parse_time, dayfirst=bool(dayfirst), date_format=self.date_format)


AUTO_DATES = DateOrder()


def _text(value: Any, where: str, field: str, *, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or (required and not value.strip()):
        raise InputError(f"{where}: field {field!r} must be a non-empty string, got {short_repr(value)}")
    check_text(value, where, field)
    return value


def to_conversation(record: Conversation | Mapping[str, Any], where: str = "conversation",
                    dates: DateOrder = AUTO_DATES) -> Conversation:
    """Validate a conversation in hipgraph's format; InputError naming the record and field.
    Its times are read as ``dates`` says (by default the date order is decided from all of them)."""
    if isinstance(record, Conversation):
        return _check_unique(record, where)
    if not isinstance(record, Mapping):
        raise InputError(f"{where}: expected an object, got {type(record).__name__}")
    cid = _text(record.get("id"), where, "id")
    speakers = record.get("speakers") or []
    if not isinstance(speakers, list) or not all(isinstance(s, str) for s in speakers):
        raise InputError(f"{where}: field 'speakers' must be a list of strings")
    for i, name in enumerate(speakers):
        check_text(name, where, f"speakers[{i}]")
    read = dates.reader(_raw_times(record, where), where)
    sessions = []
    for i, w, raw in _objects(record, where, "sessions"):
        sid = _text(raw.get("id", i + 1), w, "id")
        turns = [Turn(id=_text(t.get("id", f"{sid}:{j + 1}"), tw, "id"),
                      speaker=_text(t.get("speaker"), tw, "speaker"), text=_text(t.get("text"), tw, "text"),
                      time=_time(t, tw, read))
                 for j, tw, t in _objects(raw, w, "turns")]
        size = sum(len(t.speaker) + len(t.text) + 3 for t in turns)
        if size > MAX_DOCUMENT_CHARS:
            raise InputError(f"{w}: the session's turns hold {size:,} characters, over the limit of "
                             f"{MAX_DOCUMENT_CHARS:,} per session; split it into several sessions")
        sessions.append(Session(sid, tuple(turns), _time(raw, w, read)))
    return _check_unique(Conversation(cid, tuple(sessions), tuple(speakers)), where)


def _objects(record: Mapping[str, Any], where: str, field: str) -> list[tuple[int, str, Mapping[str, Any]]]:
    """``(index, where, object)`` for each item of the non-empty list ``record[field]``."""
    items = record.get(field)
    if not isinstance(items, list) or not items:
        raise InputError(f"{where}: field {field!r} must be a non-empty list")
    out = []
    for i, item in enumerate(items):
        w = f"{where}.{field}[{i}]"
        if not isinstance(item, Mapping):
            raise InputError(f"{w}: expected an object, got {type(item).__name__}")
        out.append((i, w, item))
    return out


def _time(record: Mapping[str, Any], where: str, read: Callable[..., Any]):
    return read(record["time"], where=f"{where}.time") if record.get("time") is not None else None


def _raw_times(record: Mapping[str, Any], where: str) -> list[tuple[str, Any]]:
    """The ``(where, value)`` times of a conversation record, sessions and their turns in order
    (malformed parts are left out here; validation names them)."""
    out: list[tuple[str, Any]] = []
    sessions = record.get("sessions")
    for i, session in enumerate(sessions if isinstance(sessions, list) else []):
        if not isinstance(session, Mapping):
            continue
        out.append((f"{where}.sessions[{i}].time", session.get("time")))
        turns = session.get("turns")
        out.extend((f"{where}.sessions[{i}].turns[{j}].time", t.get("time"))
                   for j, t in enumerate(turns if isinstance(turns, list) else []) if isinstance(t, Mapping))
    return out


def session_order_warnings(conv: Conversation) -> list[str]:
    """A line for each session whose time is earlier than the session stated before it (a sign
    of dates read in the wrong order, or sessions listed out of order)."""
    out, previous = [], None
    for session in conv.sessions:
        if session.time is None:
            continue
        if previous is not None and session.time < previous.time:
            out.append(f"conversation {conv.id!r}: session {session.id!r} ({session.time:%Y-%m-%d %H:%M}) is "
                       f"earlier than session {previous.id!r} before it ({previous.time:%Y-%m-%d %H:%M}); "
                       "check the date order (dayfirst) or the sessions' order")
        previous = session
    return out


def _check_unique(conv: Conversation, where: str) -> Conversation:
    seen_s: set[str] = set()
    seen_t: set[str] = set()
    for s in conv.sessions:
        if s.id in seen_s:
            raise InputError(f"{where}: session id {short_repr(s.id)} appears twice")
        seen_s.add(s.id)
        for t in s.turns:
            if t.id in seen_t:
                raise InputError(f"{where}: turn id {short_repr(t.id)} appears twice")
            seen_t.add(t.id)
    if "#" in conv.id:
        raise InputError(f"{where}: conversation id {short_repr(conv.id)} must not contain '#'")
    return conv


# ------------------------------------------------------------------ file formats
def read_conversation_file(path: Path, fmt: str, dates: DateOrder = AUTO_DATES
                           ) -> tuple[list[Conversation], list[dict[str, Any]]]:
    """Conversations and questions of ``path`` in format ``fmt`` (see module docstring), their
    times read as ``dates`` says (by default the date order is decided per conversation)."""
    if fmt not in FORMATS:
        raise InputError(f"unknown conversation format {fmt!r}; available: {', '.join(FORMATS)}")
    path = Path(path)
    if fmt == "conversation" and path.suffix.lower() == ".jsonl":
        rows = read_jsonl_file(path)
        if not rows:
            raise InputError("the file holds no conversations", source=str(path))
        return [to_conversation(r, f"{path}:{n}", dates) for n, r in rows], []
    data = read_json_file(path)
    if fmt == "conversation":
        items = data if isinstance(data, list) else [data]
        convs = [to_conversation(r, f"{path}: [{i}]", dates) for i, r in enumerate(items)], []
    elif fmt == "locomo":
        convs = _read_locomo(data, str(path), dates)
    else:
        convs = _read_longmemeval(data, str(path), dates)
    if not convs[0]:
        raise InputError("the file holds no conversations", source=str(path))
    return convs


def _read_locomo(data: Any, where: str, dates: DateOrder) -> tuple[list[Conversation], list[dict[str, Any]]]:
    if isinstance(data, Mapping) and isinstance(data.get("conversations"), list):
        items, flat = data["conversations"], True
        names = {int(k): v.split(" ")[0].strip("(;") for k, v in (data.get("category_names") or {}).items()}
    elif isinstance(data, list):
        items, flat, names = data, False, {}
    else:
        raise InputError(f"{where}: expected a LoCoMo list or an object with 'conversations'")
    categories = {**_LOCOMO_CATEGORIES, **names}
    convs, questions = [], []
    for i, item in enumerate(items):
        w = f"{where}: conversations[{i}]" if flat else f"{where}: [{i}]"
        if not isinstance(item, Mapping):
            raise InputError(f"{w}: expected an object")
        conv = _locomo_flat(item, w, dates) if flat else _locomo_original(item, w, dates)
        convs.append(conv)
        last = max((s.time for s in conv.sessions if s.time is not None), default=None)
        raw_qs = item.get("questions" if flat else "qa") or []
        if not isinstance(raw_qs, list):
            raise InputError(f"{w}: field {'questions' if flat else 'qa'!r} must be a list")
        for j, q in enumerate(raw_qs):
            qw = f"{w}.{'questions' if flat else 'qa'}[{j}]"
            if not isinstance(q, Mapping):
                raise InputError(f"{qw}: expected an object")
            evidence = q.get("evidence_dia_ids", q.get("evidence")) or []
            if not isinstance(evidence, list):
                raise InputError(f"{qw}: field 'evidence' must be a list of turn ids")
            cat = q.get("category")
            answer = q.get("answer", q.get("adversarial_answer"))
            questions.append({
                "id": f"{conv.id}:q{j + 1}", "question": _text(q.get("question"), qw, "question"),
                "answer": "" if answer is None else str(answer),
                "category": categories.get(cat, str(cat)) if isinstance(cat, int) else str(cat or ""),
                "evidence": [str(e) for e in evidence if isinstance(e, str)],
                "conversation": conv.id, "question_date": last.isoformat() if last else None})
    return convs, questions


def _caption(turn: Mapping[str, Any]) -> str:
    caption = turn.get("blip_caption")
    return f" [shares an image: {caption}]" if isinstance(caption, str) and caption.strip() else ""


def _locomo_flat(item: Mapping[str, Any], w: str, dates: DateOrder) -> Conversation:
    turns = item.get("turns")
    if not isinstance(turns, list) or not turns:
        raise InputError(f"{w}: field 'turns' must be a non-empty list")
    read = dates.reader([(f"{w}.turns[{j}].session_date_time", t.get("session_date_time"))
                         for j, t in enumerate(turns) if isinstance(t, Mapping)], w)
    cid = _text(item.get("id"), w, "id")
    sessions: dict[str, dict[str, Any]] = {}
    dated: dict[str, tuple[str, Any]] = {}  # session -> (where, raw value) of its first time
    for j, t in enumerate(turns):
        tw = f"{w}.turns[{j}]"
        if not isinstance(t, Mapping):
            raise InputError(f"{tw}: expected an object")
        sid = _text(t.get("session"), tw, "session")
        s = sessions.setdefault(sid, {"id": sid, "time": None, "turns": []})
        raw_time = t.get("session_date_time")
        if raw_time is not None:  # every turn's copy is read: they must agree
            at = f"{tw}.session_date_time (conversation {cid!r}, session {sid})"
            time = read(raw_time, where=at)
            if s["time"] is None:
                s["time"], dated[sid] = time, (tw, raw_time)
            elif time != s["time"]:
                first_where, first_raw = dated[sid]
                raise InputError(f"{at}: {raw_time!r} differs from the session's time {first_raw!r} "
                                 f"({first_where})")
        s["turns"].append({"id": _text(t.get("dia_id"), tw, "dia_id"), "speaker": t.get("speaker"),
                           "text": _text(t.get("text"), tw, "text") + _caption(t)})
    record = {"id": cid, "speakers": item.get("speakers") or [],
              "sessions": list(sessions.values())}
    return to_conversation(record, w, dates)


def _locomo_original(item: Mapping[str, Any], w: str, dates: DateOrder) -> Conversation:
    conv = item.get("conversation")
    if not isinstance(conv, Mapping):
        raise InputError(f"{w}: field 'conversation' must be an object")
    numbers = sorted(int(m.group(1)) for k in conv if (m := re.fullmatch(r"session_(\d+)", k)))
    cid = item.get("sample_id", item.get("id"))
    read = dates.reader([(f"{w}.conversation.session_{n}_date_time", conv.get(f"session_{n}_date_time"))
                         for n in numbers], w)
    sessions = []
    for n in numbers:
        turns = conv[f"session_{n}"]
        if not isinstance(turns, list):
            raise InputError(f"{w}.conversation.session_{n}: expected a list of turns")
        key = f"session_{n}_date_time"
        time = None if conv.get(key) is None else read(
            conv[key], where=f"{w}.conversation.{key} (conversation {cid!r}, session {n})")
        sessions.append({"id": str(n), "time": time,
                         "turns": [{"id": t.get("dia_id"), "speaker": t.get("speaker"),
                                    "text": (t.get("text") or "") + _caption(t)}
                                   if isinstance(t, Mapping) else t for t in turns]})
    speakers = [s for s in (conv.get("speaker_a"), conv.get("speaker_b")) if isinstance(s, str)]
    return to_conversation({"id": cid, "speakers": speakers, "sessions": sessions}, w, dates)


def _read_longmemeval(data: Any, where: str, dates: DateOrder) -> tuple[list[Conversation], list[dict[str, Any]]]:
    items = data if isinstance(data, list) else [data]
    convs, questions = [], []
    for i, item in enumerate(items):
        w = f"{where}: [{i}]"
        if not isinstance(item, Mapping):
            raise InputError(f"{w}: expected an object")
        qid = _text(item.get("question_id"), w, "question_id")
        hs, ids, times = (item.get("haystack_sessions"), item.get("haystack_session_ids"),
                          item.get("haystack_dates"))
        if not isinstance(hs, list) or not isinstance(ids, list) or not isinstance(times, list) \
                or not len(hs) == len(ids) == len(times):
            raise InputError(f"{w}: 'haystack_sessions', 'haystack_session_ids' and 'haystack_dates' "
                             "must be lists of the same length")
        sessions, evidence = [], []
        read = dates.reader([(f"{w}.haystack_dates[{j}]", d) for j, d in enumerate(times)]
                            + [(f"{w}.question_date", item.get("question_date"))], w)
        for j, (sid, date, turns) in enumerate(zip(ids, times, hs, strict=True)):
            if not isinstance(turns, list):
                raise InputError(f"{w}.haystack_sessions[{j}]: expected a list of turns")
            rows = []
            for k, t in enumerate(turns):
                if not isinstance(t, Mapping):
                    raise InputError(f"{w}.haystack_sessions[{j}][{k}]: expected an object")
                tid = f"{sid}:{k + 1}"
                rows.append({"id": tid, "speaker": t.get("role"), "text": t.get("content")})
                if t.get("has_answer"):
                    evidence.append(tid)
            sessions.append({"id": str(sid), "time": read(date, where=f"{w}.haystack_dates[{j}]")
                             if date is not None else None, "turns": rows})
        convs.append(to_conversation({"id": qid, "speakers": ["user", "assistant"], "sessions": sessions},
                                     w, dates))
        answer_sessions = {str(s) for s in item.get("answer_session_ids") or []}
        if not evidence:  # session-level evidence: every turn of the answer sessions
            evidence = [t.id for s in convs[-1].sessions if s.id in answer_sessions for t in s.turns]
        qdate = item.get("question_date")
        questions.append({"id": qid, "question": _text(item.get("question"), w, "question"),
                          "answer": str(item.get("answer", "")), "category": str(item.get("question_type", "")),
                          "evidence": evidence, "conversation": qid,
                          "question_date": read(qdate, where=f"{w}.question_date").isoformat()
                          if qdate else None})
    return convs, questions


# ------------------------------------------------------------------ stored form
def session_text(session: Session) -> tuple[str, list[tuple[int, int]]]:
    """The session's ``Speaker: text`` lines and each turn's character span in them."""
    parts, spans, pos = [], [], 0
    for t in session.turns:
        line = f"{t.speaker}: {' '.join(t.text.split())}"
        spans.append((pos, pos + len(line)))
        parts.append(line)
        pos += len(line) + 1
    return "\n".join(parts), spans


def session_document(conv: Conversation, session: Session, units: Sequence[tuple[int, int]],
                     granularity: str, time_in_key: bool) -> Document:
    """The stored document of one session; ``units`` are turn ranges ``[start, end)``."""
    text, spans = session_text(session)
    title = session.time.strftime("%-d %B %Y") if (time_in_key and session.time) else ""
    metadata = {
        "kind": SESSION_KIND, "conversation": conv.id, "session": session.id,
        "time": session.time.isoformat() if session.time else None,
        "speakers": list(conv.speakers), "granularity": granularity,
        "turns": [[t.id, t.speaker, s, e, t.time.isoformat() if t.time else None]
                  for t, (s, e) in zip(session.turns, spans, strict=True)],
        "units": [[spans[a][0], spans[b - 1][1]] for a, b in units],
    }
    return Document(session_key(conv.id, session.id), text, title, metadata)


_FIRST_PERSON = [(re.compile(r"\bI'm\b"), "{s} is"), (re.compile(r"\bI've\b"), "{s} has"),
                 (re.compile(r"\bI'll\b"), "{s} will"), (re.compile(r"\bI'd\b"), "{s} would"),
                 (re.compile(r"\b(I|me|myself)\b"), "{s}"), (re.compile(r"\b(my|mine)\b", re.I), "{s}'s")]


def resolve_speakers(text: str) -> str:
    """Each ``Speaker: ...`` line with first-person pronouns replaced by the speaker's name."""
    out = []
    for line in text.split("\n"):
        speaker, sep, said = line.partition(": ")
        if sep and speaker and len(speaker) <= 40:
            for pattern, repl in _FIRST_PERSON:
                said = pattern.sub(repl.format(s=speaker), said)
            line = f"{speaker}{sep}{said}"
        out.append(line)
    return "\n".join(out)


_FILLER = frozenset([
    "wow", "yeah", "yes", "yep", "haha", "lol", "awesome", "cool", "great", "nice", "thanks",
    "thank", "hey", "hi", "hello", "omg", "totally", "really", "glad", "sure", "okay", "yay",
    "amazing", "love", "lovely", "good", "happy", "fun", "super", "sounds", "wonderful",
    "fantastic", "definitely", "absolutely", "agree", "true", "right", "course"
])


def compress_key(text: str) -> str:
    """Extractive compression of a unit's key text: ``Speaker: ...`` lines with fewer than two
    content words (not stop words, not filler such as "wow", "thanks", "sounds great") are
    dropped; a unit that would lose every line is kept whole."""
    from spacy.lang.en.stop_words import STOP_WORDS  # noqa: PLC0415 - a word list, no model

    kept = []
    for line in text.split("\n"):
        said = line.partition(": ")[2] or line
        words = [w for w in re.findall(r"[a-z]{3,}", said.lower()) if w not in STOP_WORDS and w not in _FILLER]
        if len(words) >= 2:
            kept.append(line)
    return "\n".join(kept) if kept else text


def conversation_documents(conversations: Sequence[Conversation], embedder, cfg, llm=None,
                           warnings: list[str] | None = None) -> list[Document]:
    """The session documents of ``conversations``, cut into memory units per ``cfg``
    (:class:`~hipgraph.config.ConversationConfig`). Segment boundaries come from one embedding
    call over every turn of every session, or from ``llm`` (a chat client) when given; a session
    the LLM could not segment falls back to the embeddings, with a line in ``warnings``."""
    from hipgraph.indexers.segmentation import llm_segments, segment  # noqa: PLC0415

    sessions = [(c, s) for c in conversations for s in c.sessions]
    lines = [[f"{t.speaker}: {t.text}" for t in s.turns] for _, s in sessions]
    by_llm: list = [None] * len(sessions)
    if cfg.granularity == "segment" and llm is not None:
        by_llm = llm_segments(llm, lines, cfg)
    vectors = None
    if cfg.granularity == "segment" and any(not isinstance(u, list) for u in by_llm):
        flat = [line for i, ls in enumerate(lines) if not isinstance(by_llm[i], list) for line in ls]
        vectors = embedder.embed(flat) if flat else None
    docs, pos = [], 0
    for i, (conv, session) in enumerate(sessions):
        n = len(session.turns)
        if isinstance(by_llm[i], list):
            units = by_llm[i]
        elif cfg.granularity == "segment":
            if isinstance(by_llm[i], str) and warnings is not None:
                warnings.append(f"session {session_key(conv.id, session.id)}: LLM segmentation failed "
                                f"({by_llm[i]}); used embeddings")
            units = segment(vectors[pos: pos + n], cfg)
            pos += n
        else:
            units = [(j, j + 1) for j in range(n)] if cfg.granularity == "turn" else [(0, n)]
        docs.append(session_document(conv, session, units, cfg.granularity, cfg.time_in_key))
    return docs
