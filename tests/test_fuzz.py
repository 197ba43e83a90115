"""Property-based fuzzing (hypothesis) of what users hand hipgraph: generated JSON, JSONL and
conversation files through the CLI's readers and into an index, and generated questions through
``retrieve``. The properties: nothing but a typed hipgraph error escapes (no traceback), and a
refused file or list leaves the index exactly as it was (no partial write)."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import INLINE_DOCS, dump_index, index_config
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import hipgraph
from hipgraph.errors import ConfigError, InputError
from hipgraph.indexers.conversations import FORMATS, read_conversation_file
from hipgraph.indexers.documents import SkippedRecord, content_hash, to_document
from hipgraph.indexers.readers import read_inputs
from hipgraph.query.engine import MODES

# any code point, lone surrogates included (JSON escapes them; UTF-8 cannot store them)
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=30)
WORDS = st.sampled_from(["Ada Lovelace was born in London.", "Niels Bohr won the Nobel Prize in 1922.",
                         "The Thames flows through Oxford.", "  ", "", "x"])
SOME_TEXT = WORDS | ANY_TEXT
LEAF = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
        | SOME_TEXT)
VALUE = st.recursive(LEAF, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(ANY_TEXT, inner, max_size=3), max_leaves=8)
RECORD = st.fixed_dictionaries({}, optional={
    "id": st.sampled_from(["a", "b", "c"]) | st.integers(-3, 3) | VALUE,
    "text": WORDS | VALUE, "title": WORDS | VALUE, "metadata": VALUE, "tag": VALUE, "idx": VALUE})
VALID_RECORD = st.fixed_dictionaries({"id": st.sampled_from(["a", "b", "c"]), "text": WORDS},
                                     optional={"title": SOME_TEXT, "metadata": VALUE, "tag": VALUE})
RECORDS = st.lists(VALID_RECORD, min_size=1, max_size=4) | st.lists(VALID_RECORD | RECORD | VALUE, max_size=4)
TURN = st.fixed_dictionaries({"speaker": st.sampled_from(["Ann", "Ben"]) | VALUE, "text": WORDS | VALUE},
                             optional={"id": VALUE, "time": VALUE})
SESSION = st.fixed_dictionaries({"turns": st.lists(TURN | VALUE, max_size=3)},
                                optional={"id": st.sampled_from(["s1", "s2"]) | VALUE,
                                          "time": st.sampled_from(["2023-05-08", "8 May 2023, 1:56 pm"]) | VALUE})
CONVERSATION = st.fixed_dictionaries({"id": st.sampled_from(["c1", "c2"]) | VALUE,
                                      "sessions": st.lists(SESSION | VALUE, max_size=2)},
                                     optional={"speakers": VALUE})


@st.composite
def file_bytes(draw, content: st.SearchStrategy) -> bytes:
    """``content`` written as a JSON file, then (sometimes) damaged: truncated, a stray byte,
    surrogates encoded as bytes UTF-8 forbids, or deep nesting spliced in."""
    value = draw(content)
    text = json.dumps(value, ensure_ascii=draw(st.booleans()), allow_nan=True)
    data = text.encode("utf-8", "surrogatepass")
    damage = draw(st.sampled_from(["none", "none", "none", "none", "truncate", "byte", "deep"]))
    if damage == "truncate" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif damage == "byte":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\n", b"{"])) + data[at:]
    elif damage == "deep":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + b"[" * 50_000 + data[at:]
    return data


@st.composite
def jsonl_bytes(draw, item: st.SearchStrategy) -> bytes:
    lines = [json.dumps(v, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
             for v in draw(st.lists(item, max_size=4))]
    if lines and draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(
            [b"", b"   ", b"{", b"[" * 50_000, b"\xff", b"null", b"[1, 2]"])))
    return b"\n".join(lines)


DOCUMENT_FILES = st.tuples(st.just(".json"), file_bytes(RECORDS | st.fixed_dictionaries({"corpus": RECORDS}))) \
    | st.tuples(st.just(".jsonl"), jsonl_bytes(VALID_RECORD | VALID_RECORD | RECORD | VALUE))
CONVERSATION_FILES = st.tuples(st.just(".json"), file_bytes(st.lists(CONVERSATION, max_size=2) | CONVERSATION)) \
    | st.tuples(st.just(".jsonl"), jsonl_bytes(CONVERSATION))
LOCOMO_FILES = st.tuples(st.just(".json"), file_bytes(st.fixed_dictionaries({"conversations": st.lists(
    st.fixed_dictionaries({"id": VALUE, "turns": st.lists(st.fixed_dictionaries(
        {"session": VALUE, "dia_id": VALUE, "speaker": VALUE, "text": VALUE},
        optional={"session_date_time": VALUE}), max_size=3)}), max_size=2)}) | VALUE))


def _write(folder: Path, suffix: str, data: bytes) -> Path:
    path = folder / f"input{suffix}"
    path.write_bytes(data)
    return path


def _read_documents(path: Path) -> list[dict[str, Any]]:
    """What ``hipgraph index`` reads and checks before it writes; only InputError may escape."""
    records = list(read_inputs([path]))
    for record in records:
        with contextlib.suppress(SkippedRecord):
            to_document(record, where=record["_where"])
    return records


@pytest.fixture(scope="module")
def fuzz_index(tmp_path_factory, embedder):
    path = tmp_path_factory.mktemp("fuzz") / "ix"
    with hipgraph.open(path, create=True, config=index_config(), embedder=embedder) as hg:
        hg.add_documents(INLINE_DOCS)
        yield hg


def fuzz(examples: int) -> settings:
    """Derandomized (the same examples every run, no example database), no deadline."""
    return settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck),
                    derandomize=True, database=None)


@fuzz(300)
@given(DOCUMENT_FILES)
def test_document_readers_raise_only_input_errors(case):
    suffix, data = case
    with tempfile.TemporaryDirectory() as folder:
        path = _write(Path(folder), suffix, data)
        try:
            _read_documents(path)
        except InputError as exc:
            assert str(exc).startswith(str(path)) and len(str(exc)) < 500, exc


@fuzz(300)
@given(st.sampled_from(FORMATS), CONVERSATION_FILES | LOCOMO_FILES)
def test_conversation_readers_raise_only_input_errors(fmt, case):
    suffix, data = case
    with tempfile.TemporaryDirectory() as folder:
        path = _write(Path(folder), suffix, data)
        try:
            read_conversation_file(path, fmt)
        except InputError as exc:
            assert str(exc).startswith(str(path)) and len(str(exc)) < 500, exc


def _whole_or_nothing(hg, suffix: str, data: bytes, write):
    """``write(path)`` on ``data`` saved as a file; None when it refused the file with an
    InputError, after checking that the index is exactly as before (no partial write)."""
    before = dump_index(hg)
    with tempfile.TemporaryDirectory() as folder:
        try:
            return write(_write(Path(folder), suffix, data))
        except InputError:
            event("refused")
            assert dump_index(hg) == before
            return None


@fuzz(40)
@given(DOCUMENT_FILES)
def test_a_generated_file_is_indexed_whole_or_not_at_all(fuzz_index, case):
    def index(path):
        records = _read_documents(path)
        return records, fuzz_index.add_documents(records, batch_size=1)

    accepted = _whole_or_nothing(fuzz_index, *case, index)
    if accepted is None:
        return
    records, report = accepted
    event(f"accepted: {report.added} added, {report.replaced} replaced, {report.unchanged} unchanged")
    # every record with text is stored as given (the later of a repeated id wins)
    expected = {}
    for record in records:
        with contextlib.suppress(SkippedRecord):
            doc = to_document(record, where="r")
            expected[doc.id] = doc
    assert report.skipped == len(records) - sum(1 for r in records if _has_text(r))
    stored = _stored(fuzz_index)
    for key, doc in expected.items():
        assert stored[key][0] == content_hash(doc)
        assert all(text in doc.text for text in stored[key][1])


def _has_text(record: dict[str, Any]) -> bool:
    try:
        to_document(record, where="r")
    except SkippedRecord:
        return False
    return True


def _stored(hg) -> dict[str, tuple[str, list[str]]]:
    """``document key -> (content hash, passage texts)`` as DuckDB holds them."""
    rows = hg.store.con.execute("""
        SELECT d.key, d.content_hash, list(p.text ORDER BY p.ordinal) FROM documents d
        JOIN passages p ON p.doc_id = d.id GROUP BY d.key, d.content_hash""").fetchall()
    return {key: (h, texts) for key, h, texts in rows}


@fuzz(25)
@given(CONVERSATION_FILES)
def test_a_generated_conversation_file_is_remembered_whole_or_not_at_all(fuzz_index, case):
    def remember(path):
        conversations, _ = read_conversation_file(path, "conversation")
        fuzz_index.add_conversations(conversations)
        return conversations

    conversations = _whole_or_nothing(fuzz_index, *case, remember)
    if conversations is None:
        return
    event(f"accepted: {len(conversations)} conversations")
    stored = _stored(fuzz_index)
    for conv in conversations:
        for session in conv.sessions:
            texts = "\n".join(stored[f"{conv.id}#{session.id}"][1])
            assert all(" ".join(t.text.split()) in texts for t in session.turns)


QUESTIONS = st.text(st.characters(exclude_categories=()), max_size=60) | WORDS \
    | st.builds(lambda ch, n: ch * n, st.characters(exclude_categories=()), st.integers(3990, 4010))
KS = st.integers(-2, 3) | st.integers(10**6, 10**12) | st.sampled_from([None, 2.5, "3", True])


@fuzz(150)
@given(QUESTIONS, KS, st.sampled_from([m for m in MODES if m not in ("decompose", "expand")] + ["sparse", ""]))
def test_retrieve_answers_any_question_or_refuses_it(fuzz_index, question, k, mode):
    try:
        hits = fuzz_index.retrieve(question, k=k, mode=mode)
    except ConfigError:
        return
    passages = fuzz_index.stats()["passages"]
    assert isinstance(k, int) and not isinstance(k, bool) and len(hits) <= min(k, passages)
    if mode == "dense":  # every passage has a cosine; bm25 and graph may find fewer than k
        assert len(hits) == min(k, passages)
    assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
