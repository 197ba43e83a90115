"""The checking pass: whatever the write pass could fail on refuses a file (or a list) whole, with
exit 2 and one line naming the file, line and field, before anything is written; long texts without
spaces are cut, never refused; the JSON readers and the LLM reply parser survive any nesting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import INLINE_DOCS, REPO, cli_in_process, copy_index, dump_index, run_cli

from hipgraph.errors import ConfigError, ExtractionError, InputError
from hipgraph.indexers.chunking import chunk_document
from hipgraph.indexers.extract_spacy import SpacyExtractor, split_for_parsing
from hipgraph.text.json_reply import parse_json_reply
from hipgraph.text.limits import MAX_DOCUMENT_CHARS, MAX_METADATA_DEPTH, MAX_TOKEN_CHARS
from hipgraph.types import Chunk, Document

try:
    from tests.openai_server import ScriptedOpenAIServer
except ImportError:  # tests/ is not a package: pytest puts it on sys.path
    from openai_server import ScriptedOpenAIServer

DEEP = "[" * 100_000 + "]" * 100_000
GOOD = [{"id": f"good{i}", "title": f"Good {i}", "text": f"Ada Lovelace wrote note {i} in London."}
        for i in range(6)]


def _one_line(err: str) -> str:
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("hipgraph: error: "), err
    return err


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


# A bad record after six good ones, indexed 2 per batch: without the checking pass three batches
# would be committed before the write pass met it.
LATE_FAULTS = {
    "surrogate in text": ('{"id": "bad", "text": "x \\ud800 y"}', "field 'text' holds a lone surrogate"),
    "surrogate in title": ('{"id": "bad", "title": "\\udfff", "text": "fine"}', "field 'title' holds a lone"),
    "surrogate in id": ('{"id": "b\\ud834", "text": "fine"}', "field 'id' holds a lone surrogate"),
    "surrogate in metadata": ('{"id": "bad", "text": "fine", "metadata": {"k": ["\\udc80"]}}',
                              "field 'metadata.k[0]' holds a lone surrogate"),
    "surrogate in a metadata key": ('{"id": "bad", "text": "fine", "note\\ud800": 1}',
                                    "holds a lone surrogate"),
    "deep metadata": ('{"id": "bad", "text": "fine", "metadata": ' + json.dumps(_nested(MAX_METADATA_DEPTH + 1))
                      + "}", f"nested deeper than {MAX_METADATA_DEPTH} levels"),
    "NaN in metadata": ('{"id": "bad", "text": "fine", "score": NaN}', "not JSON-serializable"),
    "text over the limit": (json.dumps({"id": "bad", "text": "word " * (MAX_DOCUMENT_CHARS // 5 + 1)}),
                            "over the limit of 10,000,000 per document"),
}


@pytest.mark.parametrize("fault", list(LATE_FAULTS))
def test_a_bad_record_late_in_a_file_refuses_the_file_whole(inline_template, tmp_path, capsys, fault):
    line, message = LATE_FAULTS[fault]
    db = copy_index(inline_template, tmp_path)
    before = dump_index(db)
    jsonl = tmp_path / "late.jsonl"
    jsonl.write_text("\n".join([json.dumps(d) for d in GOOD] + [line]) + "\n", encoding="utf-8")
    assert cli_in_process("index", "--db", str(db), "--batch-size", "2", str(jsonl)) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{jsonl}:7: " in err and message in err, err
    assert dump_index(db) == before  # nothing of the file was written
    # the same record inside a JSON list names its index
    listed = tmp_path / "late.json"
    listed.write_text("[" + ",".join([json.dumps(d) for d in GOOD] + [line]) + "]", encoding="utf-8")
    assert cli_in_process("index", "--db", str(db), "--batch-size", "2", str(listed)) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{listed}[6]: " in err and message in err, err
    assert dump_index(db) == before


def test_a_list_given_to_the_api_is_checked_whole_before_its_first_batch(inline_index):
    before = dump_index(inline_index)
    bad_records = [
        ({"id": "bad", "text": "fine", "metadata": {1: "a", "b": 2}}, "not JSON-serializable"),
        ({"id": "bad", "text": "fine", "metadata": _nested(10_000)}, "nested deeper than"),
        ({"id": "bad\ud800", "text": "fine"}, "field 'id' holds a lone surrogate"),
        (Document("bad", "x \udfff", ""), "field 'text' holds a lone surrogate"),
        ({"id": ["x" * 10_000] * 100, "text": "fine"}, "field 'id' must be a string or integer"),
    ]
    for record, message in bad_records:
        with pytest.raises(InputError, match=message) as caught:
            inline_index.add_documents([*GOOD, record], batch_size=2)
        assert "record 6: " in str(caught.value) and len(str(caught.value)) < 300
        assert dump_index(inline_index) == before


def test_json_nested_past_the_parser_is_an_input_error_in_every_reader(inline_template, tmp_path, capsys):
    db = str(copy_index(inline_template, tmp_path))
    cases = {
        "deep.json": ([], DEEP),
        "deep.jsonl": ([], json.dumps(GOOD[0]) + "\n" + DEEP + "\n"),
        "meta.jsonl": ([], '{"id": "a", "text": "x", "metadata": ' + DEEP + "}\n"),
        "conv.json": (["--format", "conversation"], DEEP),
        "conv.jsonl": (["--format", "conversation"], DEEP + "\n"),
        "locomo.json": (["--format", "locomo"], '{"conversations": ' + DEEP + "}"),
        "lme.json": (["--format", "longmemeval"], DEEP),
    }
    for name, (options, content) in cases.items():
        path = tmp_path / name
        path.write_text(content, encoding="utf-8")
        assert cli_in_process("index", "--db", db, *options, str(path)) == 2, name
        err = _one_line(capsys.readouterr().err)
        line = ":2: " if name == "deep.jsonl" else (":1: " if name.endswith(".jsonl") else ": ")
        assert f"{path}{line}JSON nested too deeply to read" in err, err


def test_undecodable_bytes_in_a_conversation_file_name_the_line(inline_template, tmp_path, capsys):
    db = str(copy_index(inline_template, tmp_path))
    good = {"id": "c1", "sessions": [{"id": "s1", "turns": [{"speaker": "Ann", "text": "hello"}]}]}
    path = tmp_path / "chats.jsonl"
    path.write_bytes(json.dumps(good).encode() + b"\n\n" + b'{"id": "c2", "text": "caf\xe9"}\n')
    assert cli_in_process("index", "--db", db, "--format", "conversation", str(path)) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{path}:3: undecodable bytes (not UTF-8)" in err, err
    # line numbers count blank lines: a bad record on line 3 is named as line 3
    path.write_text(json.dumps(good) + "\n\n" + '{"id": "c2", "sessions": []}\n', encoding="utf-8")
    assert cli_in_process("index", "--db", db, "--format", "conversation", str(path)) == 2
    assert f"{path}:3: field 'sessions' must be a non-empty list" in _one_line(capsys.readouterr().err)


def test_conversation_text_that_utf8_cannot_store_is_refused(make_index):
    hg = make_index("memory")
    turn = {"speaker": "Ann", "text": "I moved to \ud800 Lisbon"}
    with pytest.raises(InputError, match=r"turns\[0\]: field 'text' holds a lone surrogate"):
        hg.add_conversation({"id": "c1", "sessions": [{"id": "s1", "turns": [turn]}]})
    with pytest.raises(InputError, match=r"field 'speakers\[1\]' holds a lone surrogate"):
        hg.add_conversation({"id": "c1", "speakers": ["Ann", "B\udc99"],
                             "sessions": [{"id": "s1", "turns": [{"speaker": "Ann", "text": "hi"}]}]})
    assert hg.stats()["documents"] == 0


def test_an_undecodable_cli_argument_exits_2(inline_template, tmp_path, capsys):
    db = str(copy_index(inline_template, tmp_path))
    assert cli_in_process("query", "--db", db, "caf\udce9 society") == 2  # how Python passes byte 0xe9
    assert "argument 4 is not valid UTF-8 (byte 0xe9 at character 3)" in _one_line(capsys.readouterr().err)
    proc = subprocess.run([sys.executable, "-m", "hipgraph", "query", "--db", db.encode(), b"caf\xe9"],
                          capture_output=True, cwd=str(REPO), timeout=300,
                          env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "LC_ALL": "C.UTF-8"})
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "argument 4 is not valid UTF-8 (byte 0xe9" in _one_line(err), err


def test_a_question_utf8_cannot_store_or_of_2_mb_is_refused_by_the_api(inline_index):
    with pytest.raises(ConfigError, match="question 1 holds a lone surrogate"):
        inline_index.retrieve_many(["fine", "caf\udce9"], k=2)
    with pytest.raises(ConfigError, match="question 0 is 2000000 characters long"):
        inline_index.retrieve("x" * 2_000_000, k=2)


@pytest.mark.parametrize("content, options, message", [
    ("", [], "the file holds no records"),
    ("\n  \n", [], "the file holds no records"),
    ("[]", [], "the file holds no records"),
    ('{"corpus": []}', [], "the file holds no records"),
    ("[]", ["--format", "conversation"], "the file holds no conversations"),
    ("", ["--format", "conversation"], "the file holds no conversations"),
    ('{"conversations": []}', ["--format", "locomo"], "the file holds no conversations"),
])
def test_an_empty_input_file_says_so(inline_template, tmp_path, capsys, content, options, message):
    db = str(copy_index(inline_template, tmp_path))
    path = tmp_path / ("in.json" if content.startswith(("[", "{")) else "in.jsonl")
    path.write_text(content, encoding="utf-8")
    assert cli_in_process("index", "--db", db, *options, str(path)) == 2
    assert f"{path}: {message}" in _one_line(capsys.readouterr().err)


def test_a_folder_without_text_files_says_so(inline_template, tmp_path, capsys):
    db = str(copy_index(inline_template, tmp_path))
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "scan.pdf").write_bytes(b"%PDF-1.4")
    assert cli_in_process("index", "--db", db, str(folder)) == 2
    assert f"{folder}: the folder holds no .txt or .md files" in _one_line(capsys.readouterr().err)


def test_text_without_spaces_is_cut_into_bounded_passages():
    text = "Ada " + "x" * 1_200_000 + " Lovelace."
    chunks = chunk_document(Document("blob", text, ""), _chunk_config())
    longest = max(len(c.text) for c in chunks)
    assert longest <= 180 * MAX_TOKEN_CHARS and len(chunks) > 200
    assert chunks[0].text.startswith("Ada x") and chunks[-1].text.endswith("Lovelace.")
    covered = sorted((c.start, c.end) for c in chunks)  # windows overlap, leave no gap
    assert covered[0][0] == 0 and covered[-1][1] == len(text)
    assert all(b[0] <= a[1] for a, b in zip(covered, covered[1:], strict=False))
    assert all(text[c.start:c.end] == c.text for c in chunks)


def _chunk_config():
    from hipgraph.config import ChunkConfig

    return ChunkConfig()


def test_split_for_parsing_cuts_after_line_breaks_and_keeps_every_character():
    text = ("line of words\n" * 20) + "y" * 90
    pieces = split_for_parsing(text, limit=100)
    assert "".join(pieces) == text and all(len(p) <= 100 for p in pieces)
    assert all(p.endswith("\n") for p in pieces[:-2])  # each cut after the last line break
    assert pieces[-1] == "y" * 90 or pieces[-1].endswith("y")
    assert split_for_parsing("z" * 250, limit=100) == ["z" * 100, "z" * 100, "z" * 50]  # no space
    assert split_for_parsing("short", limit=100) == ["short"]


def test_spacy_parses_a_passage_over_its_limit_in_pieces():
    """A memory unit (a whole session) can exceed spaCy's 1,000,000 characters: it is parsed in
    pieces and the pieces' entities and facts are merged."""
    filler = ("y" * 99 + " ") * 10_500  # 1,050,000 characters in long words: cheap to parse
    text = f"Marie Curie worked in Paris.\n{filler}\nAlbert Einstein lived in Bern."
    assert len(text) > 1_000_000 and len(split_for_parsing(text)) == 11
    [whole] = SpacyExtractor().extract([Chunk("session", 0, text, 0, len(text), "")])
    assert {"Marie Curie", "Paris", "Albert Einstein", "Bern"} <= set(whole.entities)  # first, last piece
    facts = {(t.subject, t.relation, t.object) for t in whole.triples}
    assert ("Marie Curie", "worked in", "Paris") in facts and ("Albert Einstein", "lived in", "Bern") in facts


def test_an_index_of_a_text_without_spaces_over_spacys_limit(make_index):
    hg = make_index("blob")
    report = hg.add_documents([{"id": "blob", "text": "Lisbon " + "q" * 1_050_000},
                               {"id": "ada", "text": "Ada Lovelace was born in London."}])
    assert report.added == 2 and hg.stats()["passages"] > 200
    assert hg.retrieve("Where was Ada Lovelace born?", k=1)[0].doc_id == "ada"


@pytest.mark.parametrize("reply", ["[" * 50_000, '{"a":' * 50_000, "```json\n" + "[" * 50_000 + "\n```",
                                   "Here: " + "{" * 30_000])
def test_the_reply_parser_refuses_any_nesting_with_a_value_error(reply):
    with pytest.raises(ValueError):
        parse_json_reply(reply)
    assert parse_json_reply('{"answer": "' + "[" * 50_000 + '"}') == {"answer": "[" * 50_000}


def test_an_llm_extractor_reply_of_50000_brackets_is_an_extraction_error(make_index):
    from hipgraph.config import ChatConfig, ExtractorConfig

    with ScriptedOpenAIServer(chat_handler=lambda body: "[" * 50_000) as server:
        cfg = ExtractorConfig(name="llm", chat=ChatConfig(base_url=server.base_url, model="m", max_retries=0))
        hg = make_index("llm", extractor=cfg)
        with pytest.raises(ExtractionError):
            hg.add_documents(INLINE_DOCS[:2])
    assert hg.stats()["documents"] == 0


def test_the_cli_reports_a_late_bad_record_in_its_own_process(inline_template, tmp_path):
    db = copy_index(inline_template, tmp_path)
    jsonl = tmp_path / "late.jsonl"
    jsonl.write_text("\n".join([json.dumps(d) for d in GOOD] + ['{"id": "bad", "text": "\\ud800"}']),
                     encoding="utf-8")
    proc = run_cli("index", "--db", str(db), "--batch-size", "2", str(jsonl))
    assert proc.returncode == 2 and f"{jsonl}:7: field 'text'" in _one_line(proc.stderr)
    assert not any(Path(db).glob("*.tmp"))
