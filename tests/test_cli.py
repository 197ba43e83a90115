"""The command line end to end, in subprocesses: index (JSON bundle, JSONL, folders), stats,
query, eval, bad inputs that write nothing, and a kill -9 in the middle of indexing that a re-run
of the same command resumes to the same index as an uninterrupted run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import (
    INLINE_DOCS,
    REPO,
    SAMPLE_BUNDLE,
    assert_same_index,
    build_template,
    check_consistency,
    copy_index,
    dump_index,
    fill_disk,
    run_cli,
)

import hipgraph

HIT_FIELDS = {"doc_id", "passage_id", "title", "text", "score", "rank", "why"}


def _jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _json_out(proc) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def base_index_template(tmp_path_factory, embedder):
    """An index of three inline documents, built through the API."""
    return build_template(tmp_path_factory, embedder, "base", INLINE_DOCS[:3])


@pytest.fixture
def base_index(tmp_path, base_index_template):
    return copy_index(base_index_template, tmp_path)


# ------------------------------------------------------------------ happy paths
def test_index_bundle_then_stats_query_and_eval(tmp_path, sample_docs):
    by_idx = {int(d["id"][1:]): d for d in sample_docs}
    corpus = [{"idx": i, "title": by_idx[i]["title"], "text": by_idx[i]["text"]} for i in (0, 2, 3, 6, 7, 10, 11)]
    corpus.append({"idx": 999, "title": "Nothing", "text": ""})  # skipped with a warning, counted
    question = {"id": "q1", "question": "Who was the first president of the association which published "
                                        "Journal of Psychotherapy Integration?",
                "answers": ["G. Stanley Hall"], "gold_idx": [6, 10]}
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps({"name": "tiny", "corpus": corpus, "questions": [question]}), encoding="utf-8")
    db = tmp_path / "ix"

    out = _json_out(run_cli("index", "--db", str(db), str(bundle), "--json", "-q",
                            "--chunk-tokens", "120", "--chunk-overlap", "20"))
    report = out["report"]
    assert (report["added"], report["replaced"], report["unchanged"], report["skipped"]) == (7, 0, 0, 1)
    assert len(report["warnings"]) == 1 and "'999'" in report["warnings"][0] and "no text" in report["warnings"][0]
    assert str(bundle) in report["warnings"][0]  # names where the record is
    assert out["stats"]["documents"] == 7 and out["stats"]["passages"] >= 7
    assert all(out["stats"]["edges"][t] > 0 for t in ("fact", "mention", "synonym"))

    stats = _json_out(run_cli("stats", "--db", str(db), "--json"))
    assert stats == out["stats"]
    text = run_cli("stats", "--db", str(db))
    assert text.returncode == 0 and f"documents {stats['documents']}" in text.stdout

    with hipgraph.open(db, read_only=True) as hg:
        assert hg.config.chunk.max_tokens == 120 and hg.config.chunk.overlap == 20
        assert hg.stats() == stats
        check_consistency(hg)
        keys = {r[0] for r in hg.store.con.execute("SELECT key FROM documents").fetchall()}
        assert keys == {"0", "2", "3", "6", "7", "10", "11"}

    res = _json_out(run_cli("query", "--db", str(db), "--json", "-k", "3", "--mode", "dense",
                            "Which association publishes the Journal of Psychotherapy Integration?"))
    hits = res["hits"]
    assert len(hits) == 3 and res["mode"] == "dense"
    assert all(set(h) == HIT_FIELDS for h in hits)
    assert [h["rank"] for h in hits] == [1, 2, 3]
    assert hits[0]["score"] >= hits[1]["score"] >= hits[2]["score"]
    assert hits[0]["doc_id"] == "6" and hits[0]["title"] == "Journal of Psychotherapy Integration"
    bad_k = run_cli("query", "--db", str(db), "-k", "0", "anything")
    assert bad_k.returncode == 2 and "k must be an integer >= 1" in bad_k.stderr  # a usage error

    ev = _json_out(run_cli("eval", "--db", str(db), str(bundle), "--json", "--k", "2,5"))
    assert ev["questions"] == 1 and [r["mode"] for r in ev["results"]] == ["graph", "dense", "bm25"]
    for r in ev["results"]:
        assert 0 < r["recall@5"] <= 100 and r["recall@2"] <= r["recall@5"]


def test_index_jsonl_and_folder_then_rerun_is_a_no_op(tmp_path):
    docs = [{"doc_id": d["id"], "body": d["text"], "title": d["title"], "lang": "en"} for d in INLINE_DOCS[3:6]]
    jsonl = tmp_path / "docs.jsonl"
    _jsonl(jsonl, docs)
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    (folder / "niels_bohr.txt").write_text(INLINE_DOCS[8]["text"] + "\n", encoding="utf-8")
    (folder / "sub" / "publix.md").write_text("# Publix Super Markets\n\n" + INLINE_DOCS[9]["text"] + "\n",
                                              encoding="utf-8")
    (folder / "ignored.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    db = tmp_path / "ix"
    cmd = ["index", "--db", str(db), str(jsonl), str(folder), "--id-field", "doc_id",
           "--text-field", "body", "--json", "-q"]
    out = _json_out(run_cli(*cmd))
    assert (out["report"]["added"], out["report"]["skipped"]) == (5, 0)
    assert out["stats"]["documents"] == 5
    with hipgraph.open(db, read_only=True) as hg:
        rows = hg.store.con.execute("SELECT key, title, metadata FROM documents ORDER BY key").fetchall()
        check_consistency(hg)
    got = {key: (title, json.loads(meta)) for key, title, meta in rows}
    assert got == {
        "pct": ("Person-centered therapy", {"lang": "en"}),
        "rogers": ("Carl Rogers", {"lang": "en"}),
        "jmp": ("Journal of Mathematical Physics", {"lang": "en"}),
        "niels_bohr.txt": ("niels bohr", {"path": "niels_bohr.txt"}),
        "sub/publix.md": ("Publix Super Markets", {"path": "sub/publix.md"}),
    }
    before = dump_index(db)
    again = _json_out(run_cli(*cmd))
    assert (again["report"]["added"], again["report"]["replaced"], again["report"]["unchanged"]) == (0, 0, 5)
    assert dump_index(db) == before


def test_index_the_repo_sample_bundle_with_a_limit(tmp_path):
    """The bundle `make demo` indexes (data/musique_sample.json, part of the repo)."""
    db = tmp_path / "sample"
    out = _json_out(run_cli("index", "--db", str(db), str(SAMPLE_BUNDLE), "--limit", "6", "--json", "-q"))
    assert out["report"]["added"] == 6 and out["stats"]["documents"] == 6
    corpus = json.loads(SAMPLE_BUNDLE.read_text(encoding="utf-8"))["corpus"]
    assert len(corpus) == 200
    with hipgraph.open(db, read_only=True) as hg:
        rows = hg.store.con.execute("SELECT key, title FROM documents").fetchall()
        check_consistency(hg)
    assert dict(rows) == {str(c["idx"]): c["title"] for c in corpus[:6]}


# ------------------------------------------------------------------ bad inputs
BAD_INPUTS = {
    "malformed_json": ("bad.json", b'[\n  {"id": 1, "text": "fine"},\n  {"id": 2 "text": "missing comma"}\n]\n',
                       ":3:", "malformed JSON"),
    "malformed_jsonl": ("bad.jsonl", b'{"id": 1, "text": "one"}\n{"id": 2, "text": "two"}\n{"id": 3, "text": }\n'
                        b'{"id": 4, "text": "four"}\n', ":3:", "malformed JSON line"),
    "jsonl_not_an_object": ("list.jsonl", b'{"id": 1, "text": "one"}\n[1, 2]\n', ":2", "expected an object"),
    "jsonl_missing_id": ("noid.jsonl", b'{"id": 1, "text": "one"}\n{"text": "no id"}\n', ":2", "missing field 'id'"),
    "json_not_a_list": ("obj.json", b'{"id": 1, "text": "not a list"}\n', "obj.json", "expected a list"),
    "undecodable_jsonl": ("latin1.jsonl", b'{"id": 1, "text": "one"}\n{"id": 2, "text": "caf\xe9"}\n',
                          ":2:", "not UTF-8"),
    "undecodable_txt": ("folder/notes.txt", b"Caf\xe9 au lait is served in Paris.\n", "notes.txt", "not UTF-8"),
    "missing_file": ("absent.jsonl", None, "absent.jsonl", "no such file"),
    "unsupported_file": ("table.csv", b"id,text\n1,x\n", "table.csv", "unsupported file type"),
}


def _bad_input(tmp_path, case: str):
    name, data, where, what = BAD_INPUTS[case]
    path = tmp_path / name
    if data is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    target = path.parent if case == "undecodable_txt" else path
    return target, path, where, what


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_naming_the_file_and_line_and_creates_nothing(tmp_path, case):
    target, path, where, what = _bad_input(tmp_path, case)
    db = tmp_path / "ix"
    proc = run_cli("index", "--db", str(db), str(target), "-q")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("hipgraph: error: ")
    assert str(path) in proc.stderr and where in proc.stderr and what in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not db.exists()


@pytest.mark.parametrize("case", ["malformed_jsonl", "undecodable_txt", "jsonl_missing_id"])
def test_bad_input_beside_good_input_leaves_an_existing_index_unchanged(tmp_path, base_index, case):
    target, _, where, _ = _bad_input(tmp_path, case)
    good = tmp_path / "good.jsonl"
    _jsonl(good, INLINE_DOCS[3:8])
    before = dump_index(base_index)
    proc = run_cli("index", "--db", str(base_index), str(good), str(target), "--batch-size", "2", "-q")
    assert proc.returncode == 2 and where in proc.stderr, proc.stderr
    assert dump_index(base_index) == before


def test_wrongly_typed_record_is_rejected_before_anything_is_written(tmp_path, base_index):
    """A record whose text is not a string is malformed input like a JSON syntax error: the
    command names file and line and writes nothing, not even the batches before it."""
    path = tmp_path / "typed.jsonl"
    records = [dict(d) for d in INLINE_DOCS[3:9]]
    records[4]["text"] = 12345  # line 5
    _jsonl(path, records)
    before = dump_index(base_index)
    proc = run_cli("index", "--db", str(base_index), str(path), "--batch-size", "2", "-q")
    assert proc.returncode == 2, proc.stderr
    assert f"{path}:5" in proc.stderr and "'text'" in proc.stderr, proc.stderr
    assert dump_index(base_index) == before


@pytest.mark.parametrize("command", [["stats"], ["query", "anything"]])
def test_reading_a_missing_index_is_a_clear_error(tmp_path, command):
    db = tmp_path / "nowhere"
    proc = run_cli(command[0], "--db", str(db), *command[1:])
    assert proc.returncode == 1
    assert proc.stderr.startswith("hipgraph: error: no index at") and str(db) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not db.exists()


def test_full_disk_exits_1_with_one_line_naming_the_failed_commit(tmp_path, small_disk, base_index):
    """The index sits on a full filesystem: the commit of the first new batch fails, and the
    command says so in one line (DuckDB's error, with the path), not with a traceback."""
    db = small_disk / "ix"
    shutil.copytree(base_index, db)
    before = dump_index(db)
    path = tmp_path / "more.jsonl"
    _jsonl(path, INLINE_DOCS[3:6])
    filler = fill_disk(small_disk)
    proc = run_cli("index", "--db", str(db), str(path), "-q")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(f"hipgraph: error: cannot commit to {db / 'graph.duckdb'}: ")
    assert "No space left on device" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    filler.unlink()
    assert dump_index(db) == before  # nothing of the failed run is kept


# ------------------------------------------------------------------ crash and resume
def _faiss_size(db) -> int:
    try:
        return (db / "passage.faiss").stat().st_size
    except FileNotFoundError:
        return 0


def _wal_size(db) -> int:
    """Bytes of DuckDB's write-ahead log: a commit appends to it (the database file itself may
    grow without a commit, when DuckDB checkpoints or writes ahead)."""
    try:
        return (db / "graph.duckdb.wal").stat().st_size
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_kill_9_mid_run_then_rerun_resumes_to_the_uninterrupted_index(tmp_path, sample_docs):
    docs = sample_docs  # 10 batches (extraction and embedding run ahead of the writes, so a short
    # run can end within moments of its first commit)
    source = tmp_path / "docs.jsonl"
    _jsonl(source, docs)
    crashed, clean = tmp_path / "crashed", tmp_path / "clean"

    def command(db):
        return ["index", "--db", str(db), str(source), "--batch-size", "4", "--json", "-q"]

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen([sys.executable, "-m", "hipgraph", *command(crashed)], cwd=str(REPO), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while _faiss_size(crashed) == 0:  # created, empty, when the index is opened
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline, "the index was never created"
            time.sleep(0.02)
        empty_size = _wal_size(crashed)
        # while it writes, another process gets a clear error naming the holder
        locked = run_cli("stats", "--db", str(crashed))
        assert locked.returncode == 1, locked.stderr
        assert "locked by another process" in locked.stderr and f"PID {proc.pid}" in locked.stderr
        while _wal_size(crashed) <= empty_size:  # the first batch has committed (FAISS files are
            # saved when the run ends: the kill leaves them stale, rebuilt from DuckDB on open)
            assert proc.poll() is None, "the run ended before it could be killed: " + proc.communicate()[1].decode()
            assert time.monotonic() < deadline, "no batch was committed in time"
            time.sleep(0.02)
        # a commit appends to the log in several writes: a kill between them loses that batch,
        # so wait for the log to stop growing (a batch's graph update takes longer than this)
        settled, size = time.monotonic(), _wal_size(crashed)
        while time.monotonic() - settled < 0.05 and proc.poll() is None:
            time.sleep(0.02)
            if _wal_size(crashed) != size:
                settled, size = time.monotonic(), _wal_size(crashed)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    with hipgraph.open(crashed, read_only=True) as hg:
        done = hg.stats()["documents"]
        assert 4 <= done < len(docs), "the kill did not interrupt the run"
        assert done % 4 == 0, f"{done} documents: a batch was half written"
        assert hg.store.meta_get("generation") == done // 4

    resumed = _json_out(run_cli(*command(crashed)))["report"]
    assert (resumed["unchanged"], resumed["added"], resumed["replaced"]) == (done, len(docs) - done, 0)
    _json_out(run_cli(*command(clean)))
    with hipgraph.open(crashed, read_only=True) as hg:
        assert hg.vectors.repaired == []  # the FAISS files on disk match DuckDB
        check_consistency(hg)
        a = dump_index(hg)
    b = dump_index(clean)
    assert a["stats"]["documents"] == len(docs)
    assert_same_index(a, b)
