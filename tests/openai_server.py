"""A real local HTTP server speaking enough of the OpenAI protocol for tests.

``ScriptedOpenAIServer`` listens on 127.0.0.1 (a free port) in a daemon thread and only answers
loopback clients. ``/v1/chat/completions`` replies come from a script queue, each item one of:

* ``str`` - a normal completion whose message content is that string;
* ``(status, body)`` or ``(status, body, headers)`` - an error reply (``body`` str or JSON-able);
* ``("sleep", seconds)`` - wait that long (past the client's timeout), then answer "late".

When the queue is empty, ``chat_handler(body)`` (if given) produces the item. ``/v1/embeddings``
returns deterministic hash-seeded vectors (see :meth:`ScriptedOpenAIServer.vector_for`), in
reverse order with correct ``index`` fields; ``embedding_script`` queues error items for it.
"""

from __future__ import annotations

import collections
import hashlib
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

Item = Any  # str | tuple[int, Any] | tuple[int, Any, dict] | tuple["sleep", float]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: ScriptedOpenAIServer

    def verify_request(self, request: Any, client_address: Any) -> bool:
        return client_address[0] in ("127.0.0.1", "::1")

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that timed out and hung up are expected in tests


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._send(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        owner = self.server.owner
        with owner.lock:
            owner.requests.append((self.path, body, {k.lower(): v for k, v in self.headers.items()}))
        if body is None:
            self._send(400, {"error": {"message": "body is not JSON"}})
        elif self.path == "/v1/chat/completions":
            self._reply_chat(owner, body)
        elif self.path == "/v1/embeddings":
            self._reply_embeddings(owner, body)
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def _reply_chat(self, owner: ScriptedOpenAIServer, body: dict[str, Any]) -> None:
        with owner.lock:
            item = owner.script.popleft() if owner.script else None
        if item is None:
            if owner.chat_handler is None:
                self._send(500, {"error": {"message": "no scripted reply left"}})
                return
            item = owner.chat_handler(body)
        if isinstance(item, tuple) and item and item[0] == "sleep":
            time.sleep(float(item[1]))
            item = "late"
        if isinstance(item, tuple):
            status, payload, *rest = item
            self._send(int(status), payload, headers=rest[0] if rest else None)
            return
        self._send(200, {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "test-model"),
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": str(item)},
                "finish_reason": "stop",
            }],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })

    def _reply_embeddings(self, owner: ScriptedOpenAIServer, body: dict[str, Any]) -> None:
        with owner.lock:
            item = owner.embedding_script.popleft() if owner.embedding_script else None
        if isinstance(item, tuple):
            status, payload, *rest = item
            self._send(int(status), payload, headers=rest[0] if rest else None)
            return
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not all(isinstance(t, str) and t for t in inputs):
            self._send(400, {"error": {"message": "input must be non-empty strings"}})
            return
        data = [
            {"object": "embedding", "index": i, "embedding": owner.vector_for(t).tolist()}
            for i, t in enumerate(inputs)
        ]
        data.reverse()  # clients must sort by index
        self._send(200, {"object": "list", "data": data, "model": body.get("model"),
                         "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)}})

    def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        raw = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(raw)
        except OSError:
            self.close_connection = True


class ScriptedOpenAIServer:
    """Context manager running the scripted server; see the module docstring."""

    def __init__(
        self,
        script: list[Item] | None = None,
        *,
        chat_handler: Callable[[dict[str, Any]], Item] | None = None,
        embedding_dim: int = 16,
    ) -> None:
        self.script: collections.deque[Item] = collections.deque(script or [])
        self.embedding_script: collections.deque[Item] = collections.deque()
        self.chat_handler = chat_handler
        self.embedding_dim = embedding_dim
        self.requests: list[tuple[str, Any, dict[str, str]]] = []
        self.lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def add(self, *items: Item) -> None:
        """Append chat replies to the script."""
        with self.lock:
            self.script.extend(items)

    def requests_to(self, path: str) -> list[tuple[str, Any, dict[str, str]]]:
        with self.lock:
            return [r for r in self.requests if r[0] == path]

    @property
    def chat_requests(self) -> list[tuple[str, Any, dict[str, str]]]:
        return self.requests_to("/v1/chat/completions")

    @property
    def embedding_requests(self) -> list[tuple[str, Any, dict[str, str]]]:
        return self.requests_to("/v1/embeddings")

    def vector_for(self, text: str) -> np.ndarray:
        """The (unnormalized) vector this server returns for ``text``."""
        seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
        return np.random.default_rng(seed).standard_normal(self.embedding_dim)

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("server is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> ScriptedOpenAIServer:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None
