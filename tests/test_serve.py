"""``hipgraph serve``: a real server process on a free loopback port, driven by a real HTTP client
(httpx): the endpoints, field-naming errors, the bearer token, the body limit, concurrent readers
beside a writer, acknowledged writes surviving ``kill -9``, and SIGTERM finishing a batch."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import REPO

from hipgraph.serve import is_loopback, token_from_env
from hipgraph.serve.writer import QueueFull, WriteQueue

TOKEN = "t0k3n-for-the-tests-only"
DOCS = [{"id": "ada", "text": "Ada Lovelace wrote the first program for the Analytical Engine."},
        {"id": "babbage", "text": "Charles Babbage designed the Analytical Engine in London."},
        {"id": "turing", "text": "Alan Turing worked at Bletchley Park during the war."}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``hipgraph serve`` in a subprocess; ``client`` talks to it."""

    def __init__(self, db: Path, *args: str, token: str | None = None):
        self.db, self.args, self.token = db, args, token
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180) -> Server:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        if self.token:
            env["HIPGRAPH_TEST_TOKEN"] = self.token
        cmd = [sys.executable, "-m", "hipgraph", "serve", "--db", str(self.db), "--create",
               "--port", str(self.port), *self.args]
        if self.token:
            cmd += ["--token-env", "HIPGRAPH_TEST_TOKEN"]
        self.proc = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}: {self.proc.stderr.read()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise AssertionError("server did not come up")

    def client(self, token: str | None = "default") -> httpx.Client:
        token = self.token if token == "default" else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=120)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 90) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("serve") / "ix").start()
    yield srv
    assert srv.stop() == 0


def test_documents_retrieve_answer_facts_stats(server):
    with server.client() as c:
        health = c.get("/health").json()
        assert health["status"] == "ok" and health["embedder"].startswith("minilm")
        r = c.post("/v1/documents", json={"documents": DOCS})
        assert r.status_code == 200 and r.json()["added"] == 3
        assert c.post("/v1/documents", json={"documents": DOCS}).json()["unchanged"] == 3
        hits = c.post("/v1/retrieve", json={"question": "Who designed the Analytical Engine?", "k": 2}).json()["hits"]
        assert hits[0]["doc_id"] == "babbage" and hits[0]["rank"] == 1 and "seed_facts" in hits[0]["why"]
        both = c.post("/v1/retrieve", json={"questions": ["Who designed the Analytical Engine?",
                                                          "Where did Turing work?"], "k": 1, "mode": "dense"}).json()
        assert [r[0]["doc_id"] for r in both["results"]] == ["babbage", "turing"]
        doc = c.get("/v1/documents/ada").json()
        assert doc["id"] == "ada" and doc["passages"][0]["text"] == DOCS[0]["text"]
        assert c.get("/v1/documents/nobody").status_code == 404
        answer = c.post("/v1/answer", json={"question": "Who designed the Analytical Engine?"}).json()
        assert "[1] " in answer["context"] and answer["citations"][0]["doc_id"] == "babbage"
        facts = c.get("/v1/facts", params={"entity": "Charles Babbage"}).json()["facts"]
        assert any(f["relation"] == "designed" and f["object"] == "analytical engine" for f in facts)
        stats = c.get("/v1/stats").json()
        assert stats["documents"] == 3 and stats["passages"] == 3
        assert c.delete("/v1/documents/turing").json()["deleted"] == 1
        assert c.delete("/v1/documents/turing").status_code == 404
        assert c.get("/v1/stats").json()["documents"] == 2
        assert "/v1/retrieve" in c.get("/openapi.json").json()["paths"]


def test_conversation_memory_over_http(server):
    conv = {"id": "ana", "speakers": ["Ana", "Ben"], "sessions": [
        {"id": "1", "time": "2023-01-15 10:00", "turns": [
            {"speaker": "Ana", "text": "I live in Lisbon now."}, {"speaker": "Ben", "text": "Lovely!"}]},
        {"id": "2", "time": "2023-06-10 18:00", "turns": [
            {"speaker": "Ana", "text": "Big news: I live in Berlin now."}]}]}
    with server.client() as c:
        assert c.post("/v1/conversations", json={"conversation": conv}).json()["added"] == 2
        hits = c.post("/v1/retrieve", json={"question": "Where does Ana live?", "k": 2}).json()["hits"]
        assert hits[0]["turn_ids"] == ["2:1"] and hits[0]["text"] == "Ana: Big news: I live in Berlin now."
        past = c.post("/v1/retrieve", json={"question": "Where does Ana live?", "as_of": "2023-02-01"}).json()["hits"]
        memory = [h for h in past if h.get("turn_ids")]  # the documents of other tests compete too
        assert memory[0]["text"] == "Ana: I live in Lisbon now." and {h["session"] for h in memory} == {"1"}
        units = c.post("/v1/retrieve", json={"question": "Where does Ana live?", "memory_hits": "unit"}).json()["hits"]
        assert units[0]["turn_ids"] == ["2:1"] and len([h for h in units if h.get("turn_ids")]) == 2
        bad = c.post("/v1/conversations", json={"conversation": {**conv, "sessions": []}})
        assert bad.status_code == 422 and "field 'sessions' must be a non-empty list" in bad.json()["error"]
        assert c.delete("/v1/conversations/ana").json()["deleted"] == 2
        assert c.delete("/v1/conversations/ana").status_code == 404


def test_bad_requests_name_the_field(server):
    with server.client() as c:
        cases = [
            ("/v1/documents", {"documents": [{"id": "x"}]}, "documents[0].text: Field required"),
            ("/v1/documents", {"documents": []}, "body.documents"),
            ("/v1/documents", {"docs": []}, "body.docs: Extra inputs are not permitted"),
            ("/v1/retrieve", {"question": "q", "k": 0}, "body.k: Input should be greater than or equal to 1"),
            ("/v1/retrieve", {"question": "q", "k": 10**6}, "body.k: Input should be less than or equal to 1000"),
            ("/v1/retrieve", {"question": "q", "mode": "magic"}, "unknown retrieval mode 'magic'"),
            ("/v1/retrieve", {"k": 3}, "give either 'question' or 'questions'"),
            ("/v1/retrieve", {"question": "  "}, "question 0 is empty"),
            ("/v1/retrieve", {"question": "q", "as_of": "someday"}, "as_of: cannot read 'someday'"),
        ]
        for path, body, message in cases:
            r = c.post(path, json=body)
            assert r.status_code == 422, (body, r.text)
            assert message in r.json()["error"], (body, r.json())
        r = c.post("/v1/documents", content=b'{"documents": [', headers={"content-type": "application/json"})
        assert r.status_code == 422 and "JSON" in r.json()["error"]
        assert c.get("/v1/stats").status_code == 200  # nothing above broke the server


def test_bearer_token_and_body_limit(tmp_path):
    srv = Server(tmp_path / "ix", "--max-body-mb", "1", token=TOKEN).start()
    try:
        with srv.client(token=None) as anonymous:
            assert anonymous.get("/health").status_code == 200  # liveness needs no token
            r = anonymous.post("/v1/retrieve", json={"question": "q"})
            assert r.status_code == 401 and "bearer token" in r.json()["error"]
            # the docs page, its files and the schema hold no index data: a browser opens them
            assert anonymous.get("/docs").status_code == 200
            assert anonymous.get("/docs/assets/swagger-ui.css").status_code == 200
            schema = anonymous.get("/openapi.json").json()
            assert schema["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
            assert schema["security"] == [{"bearer": []}]
            assert anonymous.get("/docs/assets/../v1/stats").status_code in (401, 404)
        with srv.client(token="x" * len(TOKEN)) as wrong:
            assert wrong.get("/v1/stats").status_code == 401
        with srv.client() as c:
            assert c.get("/v1/stats").status_code == 200
            big = {"documents": [{"id": "big", "text": "word " * 300_000}]}
            r = c.post("/v1/documents", json=big)
            assert r.status_code == 413 and "over the limit of 1,048,576" in r.json()["error"]

            def chunked():  # no Content-Length: counted as it arrives
                for _ in range(300):
                    yield b" " * 10_000

            r = c.post("/v1/documents", content=chunked(), headers={"content-type": "application/json"})
            assert r.status_code == 413 and "over the limit of 1,048,576 bytes" in r.json()["error"]
            small = c.post("/v1/documents", content=iter([b'{"documents": [{"id": "s", ', b'"text": "tiny"}]}']),
                           headers={"content-type": "application/json"})
            assert small.status_code == 200 and small.json()["added"] == 1
            assert c.delete("/v1/documents/s").json()["deleted"] == 1
            assert c.get("/v1/stats").json()["documents"] == 0
    finally:
        assert srv.stop() == 0


def test_off_loopback_needs_a_token(tmp_path):
    from conftest import run_cli

    proc = run_cli("serve", "--db", str(tmp_path / "ix"), "--create", "--host", "0.0.0.0")
    assert proc.returncode == 2 and "needs a bearer token" in proc.stderr
    assert not (tmp_path / "ix").exists()
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    with pytest.raises(Exception, match="not set or empty"):
        token_from_env("HIPGRAPH_SURELY_UNSET_VARIABLE", "127.0.0.1")


def test_readers_beside_a_writer_see_no_errors(server):
    errors: list[str] = []
    stop = threading.Event()

    def read() -> None:
        with server.client() as c:
            while not stop.is_set():
                r = c.post("/v1/retrieve", json={"question": "Who designed the Analytical Engine?", "k": 3})
                if r.status_code != 200:
                    errors.append(r.text)

    readers = [threading.Thread(target=read) for _ in range(4)]
    for t in readers:
        t.start()
    acked = []
    with server.client() as c:
        for i in range(6):
            r = c.post("/v1/documents", json={"documents": [
                {"id": f"load-{i}-{j}", "text": f"Engine model {i}.{j} was built in workshop {j}."} for j in range(5)]})
            assert r.status_code == 200, r.text
            acked += [f"load-{i}-{j}" for j in range(5)]
    stop.set()
    for t in readers:
        t.join()
    assert not errors
    with server.client() as c:
        assert all(c.get(f"/v1/documents/{d}").status_code == 200 for d in acked)


def test_acknowledged_writes_survive_kill_9_and_sigterm_finishes_the_batch(tmp_path):
    db = tmp_path / "ix"
    srv = Server(db).start()
    acked: list[str] = []
    with srv.client() as c:
        for i in range(4):
            batch = [{"id": f"d{i}-{j}", "text": f"Document {i}-{j} tells of bridge number {i * 10 + j}."}
                     for j in range(10)]
            assert c.post("/v1/documents", json={"documents": batch}).status_code == 200
            acked += [d["id"] for d in batch]
    # a batch in flight when the process is killed: either all of it is there afterwards or none
    late = [{"id": f"late-{j}", "text": f"A late document about tunnel {j}. " * 20} for j in range(40)]
    sender = threading.Thread(target=lambda: _post_quietly(srv, {"documents": late}))
    sender.start()
    time.sleep(1.0)
    srv.stop(signal.SIGKILL)
    sender.join()
    srv = Server(db).start()
    try:
        with srv.client() as c:
            missing = [d for d in acked if c.get(f"/v1/documents/{d}").status_code != 200]
            assert not missing
            present = sum(c.get(f"/v1/documents/{d['id']}").status_code == 200 for d in late)
            assert present in (0, len(late))
            # SIGTERM while a batch is being written: it is answered and kept, then the server exits 0
            result: dict = {}
            batch = [{"id": f"term-{j}", "text": f"Terminal document {j} on canal {j}. " * 20} for j in range(40)]
            sender = threading.Thread(target=lambda: result.update(r=_post_quietly(srv, {"documents": batch})))
            sender.start()
            time.sleep(1.0)
    finally:
        code = srv.stop(signal.SIGTERM)
    sender.join()
    assert code == 0
    srv = Server(db).start()
    try:
        with srv.client() as c:
            if result.get("r") is not None and result["r"].status_code == 200:
                assert all(c.get(f"/v1/documents/{d['id']}").status_code == 200 for d in batch)
            assert c.get("/v1/stats").json()["documents"] >= len(acked)
    finally:
        assert srv.stop() == 0


def _post_quietly(srv: Server, body: dict):
    try:
        with srv.client() as c:
            return c.post("/v1/documents", json=body)
    except httpx.TransportError:
        return None


def test_write_queue_runs_in_order_and_refuses_when_full():
    queue = WriteQueue(capacity=1)
    gate, started, order = threading.Event(), threading.Event(), []

    def slow():
        started.set()
        gate.wait(10)
        order.append("slow")
        return "slow"

    first = threading.Thread(target=lambda: queue.submit(slow))
    first.start()
    started.wait(10)  # the writer runs it: the queue itself is empty again
    second = threading.Thread(target=lambda: order.append(queue.submit(lambda: "second")))
    second.start()
    deadline = time.monotonic() + 10
    while queue.pending() < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(QueueFull, match="1 writes are waiting"):
        queue.submit(lambda: "third")
    gate.set()
    first.join()
    second.join()
    assert order == ["slow", "second"]
    with pytest.raises(ZeroDivisionError):
        queue.submit(lambda: 1 / 0)  # the call's own error reaches the caller
    queue.close()
    with pytest.raises(QueueFull, match="shutting down"):
        queue.submit(lambda: None)


def test_write_queue_runs_its_idle_task_on_the_writer_thread_between_calls():
    ran: list[str] = []
    idle = threading.Event()
    fail = [True]

    def on_idle():
        ran.append(threading.current_thread().name)
        if fail[0]:
            fail[0] = False
            raise OSError("disk full")  # logged; the writer carries on
        idle.set()

    queue = WriteQueue(capacity=4, on_idle=on_idle, idle_after=0.05)
    try:
        assert idle.wait(10)  # ran twice at least: the failure did not stop the writer
        assert set(ran) == {"hipgraph-writer"}
        assert queue.submit(lambda: "after") == "after"  # calls are still answered
    finally:
        queue.close()


def test_read_batcher_shares_calls_and_keeps_each_requests_answer_and_error(inline_index):
    from hipgraph.errors import ConfigError
    from hipgraph.serve.batcher import ReadBatcher

    calls: list[int] = []
    gate = threading.Event()

    def retrieve_many(questions, **kw):
        calls.append(len(questions))
        gate.wait(10)  # the first call holds the worker while the others queue up
        return inline_index.retrieve_many(questions, **kw)

    batcher = ReadBatcher(retrieve_many, max_questions=64, workers=1)
    questions = ["Who founded the company?", "Where is the river?", "What did the author write?"] * 4
    answers: dict[int, list] = {}
    errors: dict[int, Exception] = {}

    def ask(i: int, **kw) -> None:
        try:
            answers[i] = batcher.retrieve([kw.get("question", questions[i])], k=kw.get("k", 3),
                                          mode=kw.get("mode", "graph"), config=None,
                                          question_dates=None, as_of=None)
        except Exception as exc:  # noqa: BLE001 - asserted below
            errors[i] = exc

    first = threading.Thread(target=ask, args=(0,))
    first.start()
    while not calls:
        time.sleep(0.01)
    rest = [threading.Thread(target=ask, args=(i,)) for i in range(1, 8)]
    rest.append(threading.Thread(target=ask, args=(8,), kwargs={"question": "   "}))  # refused
    rest.append(threading.Thread(target=ask, args=(9,), kwargs={"k": 2}))  # other settings
    for t in rest:
        t.start()
    time.sleep(0.5)
    gate.set()
    for t in [first, *rest]:
        t.join()
    batcher.close()
    # the seven waiting and the bad one share a call; it fails, so they are answered one by one
    # (8 calls of 1) and only the bad one gets the error; k=2 is a batch of its own
    assert calls[0] == 1 and sorted(calls) == [1] * 10 + [8], calls
    assert isinstance(errors.pop(8), ConfigError) and not errors
    assert len(answers[9][0]) == 2
    for i in range(8):
        expected = inline_index.retrieve_many([questions[i]], k=3)
        assert [[h.passage_id for h in hs] for hs in answers[i]] == [[h.passage_id for h in hs] for hs in expected]
    with pytest.raises(ConfigError, match="question_dates has 2 entries for 1 questions"):
        ReadBatcher(retrieve_many).retrieve(["q"], k=1, mode="graph", config=None,
                                            question_dates=["2024-01-01", None], as_of=None)


def _chromium() -> str:
    import shutil

    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise AssertionError("the explorer test needs Debian's chromium: apt-get install -y chromium "
                             "(make test installs it)")
    return path


def test_explorer_page_draws_the_question_subgraph_in_headless_chromium(server, tmp_path):
    from urllib.parse import quote

    import matplotlib.image as mpimg
    import numpy as np

    with server.client() as c:
        c.post("/v1/documents", json={"documents": DOCS})
        graph = c.get("/v1/graph", params={"question": "Who designed the Analytical Engine?", "k": 2}).json()
        assert graph["nodes"] and graph["edges"]
        assert sum(1 for n in graph["nodes"] if n.get("retrieved")) == 2
        assert any(e["on_path"] for e in graph["edges"])
        page = c.get("/")
        assert page.status_code == 200 and "<svg" in page.text
        assert "http://" not in page.text.replace("http://www.w3.org/2000/svg", "")  # nothing fetched elsewhere
    url = f"{server.url}/?q={quote('Who designed the Analytical Engine?')}&k=2"
    browser = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000"]
    dom = subprocess.run([*browser, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    assert 'data-ready="1"' in dom, dom[-2000:]
    assert dom.count("<circle") == len(graph["nodes"]) and "Charles Babbage designed" in dom
    shot = tmp_path / "explorer.png"
    subprocess.run([*browser, "--window-size=1200,800", f"--screenshot={shot}", url],
                   capture_output=True, timeout=120, check=True)
    pixels = mpimg.imread(str(shot))[:, :, :3]
    graph_half = pixels[:, pixels.shape[1] // 2:]

    def share(rgb: tuple[int, int, int]) -> float:
        return float((np.abs(graph_half - np.array(rgb) / 255).max(axis=2) < 0.06).mean())

    assert share((0xE4, 0x57, 0x2E)) > 1e-4  # the retrieved passages' nodes are drawn
    assert share((0x29, 0xA3, 0x29)) > 1e-4  # seed entities and the on-path edges


def test_docs_page_renders_the_api_from_the_package_in_headless_chromium(server):
    import re

    with server.client() as c:
        page = c.get("/docs")
        assert page.status_code == 200
        # every file the page loads comes from this server (no CDN)
        refs = re.findall(r'(?:src|href|url)\s*[:=]\s*["\']([^"\']+)', page.text)
        assert refs and all(ref.startswith("/") for ref in refs), refs
        js = c.get("/docs/assets/swagger-ui-bundle.js")
        assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
        assert c.get("/docs/assets/package.json").status_code == 404  # only the files named
        assert "securitySchemes" not in c.get("/openapi.json").text  # no token: none offered
    browser = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000"]
    dom = subprocess.run([*browser, "--dump-dom", f"{server.url}/docs"], capture_output=True, text=True,
                         timeout=120).stdout
    assert "opblock" in dom and "/v1/retrieve" in dom and "/v1/conversations" in dom, dom[-2000:]


MCP_INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}
MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def test_mcp_over_http_guards_dns_rebinding_on_loopback_and_takes_any_host_behind_a_token(server, tmp_path):
    with server.client() as c:  # loopback: a page that rebinds a name to 127.0.0.1 is refused
        ok = c.post("/mcp", json=MCP_INIT, headers=MCP_HEADERS)
        assert ok.status_code == 200, ok.text
        rebound = c.post("/mcp", json=MCP_INIT, headers={**MCP_HEADERS, "host": f"evil.example:{server.port}"})
        assert rebound.status_code in (400, 403, 421), rebound.status_code
    srv = Server(tmp_path / "ix", "--host", "0.0.0.0", token=TOKEN).start()
    try:  # off loopback: whatever name clients use, behind the token
        with srv.client() as c:
            named = c.post("/mcp", json=MCP_INIT, headers={**MCP_HEADERS, "host": f"hipgraph.internal:{srv.port}"})
            assert named.status_code == 200, named.text
        with srv.client(token=None) as anonymous:
            assert anonymous.post("/mcp", json=MCP_INIT, headers=MCP_HEADERS).status_code == 401
    finally:
        assert srv.stop() == 0


def test_mcp_tools_over_streamable_http_under_serve(server):
    import asyncio
    import json as _json

    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def steps():
        async with streamable_http_client(f"{server.url}/mcp") as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as s:
                await s.initialize()
                names = {t.name for t in (await s.list_tools()).tools}
                assert names == {"remember", "add_documents", "recall", "answer", "stats"}
                done = await s.call_tool("add_documents", {"documents": [
                    {"id": "mcp-note", "text": "The lighthouse keeper Mara paints gulls on Sundays."}]})
                assert not done.is_error and _json.loads(done.content[0].text)["added"] == 1
                hits = await s.call_tool("recall", {"question": "Who paints gulls?", "k": 3})
                return _json.loads(hits.content[0].text)["hits"]

    hits = asyncio.run(steps())
    assert any(h["doc_id"] == "mcp-note" for h in hits)
    with server.client() as c:  # written through the server's one writer, visible over REST too
        assert c.get("/v1/documents/mcp-note").status_code == 200
