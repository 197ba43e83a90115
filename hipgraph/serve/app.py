"""The HTTP/JSON API over one open index (``hipgraph serve``).

Reads (retrieve, answer, facts, stats, a document) run concurrently in the server's thread pool on
the one :class:`~hipgraph.HipGraph` handle, which is safe from many threads; retrievals waiting at
the same time share one ``retrieve_many`` call (:mod:`hipgraph.serve.batcher`); writes (documents,
conversations, deletions) go through the single writer (:mod:`hipgraph.serve.writer`) and are
answered only after their batch is committed. Errors are JSON ``{"error": message}``: 422 for
input the index refuses (the message names the record and field), 404 for an absent document, 401
without the bearer token, 413 for a body over the limit, 503 with ``Retry-After`` when the write
queue is full.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from hipgraph.config import GeneratorConfig
from hipgraph.errors import ConfigError, HipgraphError, InputError
from hipgraph.serve.batcher import ReadBatcher
from hipgraph.serve.writer import QueueFull, WriteQueue

logger = logging.getLogger(__name__)

EXPLORER = Path(__file__).with_name("explorer.html")
# the docs page's Swagger UI (swagger-ui-dist, Apache-2.0, vendored: see swagger_ui/VERSION)
SWAGGER_UI = Path(__file__).with_name("swagger_ui")
SWAGGER_FILES = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
                 "favicon-32x32.png": "image/png"}
DOCS_ASSETS = "/docs/assets/"
# served without the token: they hold no index data (the schema is the same for every server)
PUBLIC_PATHS = ("/health", "/", "/docs", "/openapi.json")
MAX_K = 1000
MAX_QUESTIONS = 256
MAX_DOCUMENTS = 10_000


@dataclass(frozen=True)
class ServeConfig:
    """Server settings: the bearer ``token`` every request must carry (None: none needed; the
    CLI requires one off loopback), the largest request body, the write queue's capacity and the
    generator ``/v1/answer`` uses (set when the server starts, never by a request)."""

    token: str | None = None
    max_body_bytes: int = 64 * 1024 * 1024
    write_queue: int = 64
    read_batch: int = 64  # questions answered by one retrieve_many call at most
    read_workers: int = 2  # threads running those calls (2: one batch forms while one runs)
    vector_save_s: float = 5.0  # FAISS files saved at most this often during writes (0: each write)
    generator: GeneratorConfig = GeneratorConfig()
    mcp: bool = True  # the MCP tools over streamable HTTP at /mcp (when the SDK is installed)
    loopback: bool = True  # listening on a loopback address only (see _mcp_app)

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.write_queue < 1:
            raise ConfigError(f"write_queue must be >= 1, got {self.write_queue}")
        if not self.vector_save_s >= 0:
            raise ConfigError(f"vector_save_s must be >= 0, got {self.vector_save_s}")
        if self.read_batch < 1 or self.read_workers < 1:
            raise ConfigError(f"read_batch and read_workers must be >= 1, got {self.read_batch}, "
                              f"{self.read_workers}")
        if self.token is not None and len(self.token) < 16:
            raise ConfigError("the bearer token must be at least 16 characters")
        if not self.loopback and self.token is None:
            raise ConfigError("serving beyond loopback needs a bearer token")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DocumentIn(BaseModel):
    id: str = Field(min_length=1)
    text: str
    title: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)


class DocumentsIn(_Strict):
    documents: list[DocumentIn] = Field(min_length=1, max_length=MAX_DOCUMENTS)


class ConversationIn(_Strict):
    conversation: dict[str, Any]
    dayfirst: bool | None = None
    date_format: str | None = None


class RetrieveIn(_Strict):
    question: str | None = None
    questions: list[str] | None = Field(default=None, min_length=1, max_length=MAX_QUESTIONS)
    k: int = Field(default=5, ge=1, le=MAX_K)
    mode: str = "graph"
    question_date: str | None = None
    question_dates: list[str | None] | None = None
    as_of: str | None = None
    memory_hits: Literal["turn", "unit"] | None = None


class AnswerIn(_Strict):
    question: str
    k: int | None = Field(default=None, ge=1, le=MAX_K)
    mode: str = "graph"
    question_date: str | None = None
    as_of: str | None = None


def _error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers or None)


class BodyLimit:
    """Refuses a request body over ``limit`` bytes with 413: by its ``Content-Length`` before
    reading it, and a body without one (chunked) while it arrives (buffered up to the limit)."""

    def __init__(self, app: Any, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) > self.limit:
                await self._refuse(send, f"request body of {int(length):,} bytes is over the limit of {self.limit:,}")
                return
            await self.app(scope, receive, send)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.limit:
                await self._refuse(send, f"request body is over the limit of {self.limit:,} bytes")
                return
        body, sent = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(send: Any, message: str) -> None:
        await JSONResponse({"error": message}, status_code=413)({"type": "http"}, None, send)


def _json(content: Any) -> JSONResponse:
    """Plain JSON data sent as it is: FastAPI's generic encoder walks every value of a response
    (several ms for the hits of one graph query)."""
    return JSONResponse(content)


def _field_errors(exc: RequestValidationError) -> str:
    """Pydantic's errors as ``body.documents[2].text: Field required; ...``."""
    parts = []
    for err in exc.errors():
        loc = ""
        for item in err.get("loc", ()):
            loc += f"[{item}]" if isinstance(item, int) else (f".{item}" if loc else str(item))
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def _mcp_app(hg: Any, config: ServeConfig, writer: WriteQueue):
    """The MCP tools (:mod:`hipgraph.serve.mcp_server`) as a streamable-HTTP app whose writes
    go through ``writer``; None without the SDK."""
    try:
        from hipgraph.serve.mcp_server import build_server  # noqa: PLC0415

        server = build_server(hg, config.generator, write=writer.submit)
    except ImportError:
        logger.info("the mcp package is not installed: no /mcp endpoint")
        return None
    if config.loopback:  # the SDK's DNS-rebinding guard: Host and Origin must be localhost
        return server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1",
                                          max_request_body_size=config.max_body_bytes)
    # off loopback the Host clients use cannot be known here, and every request needs the
    # bearer token, which a page rebinding a name to this server cannot send
    from mcp.server.transport_security import TransportSecuritySettings  # noqa: PLC0415

    return server.streamable_http_app(
        streamable_http_path="/mcp", max_request_body_size=config.max_body_bytes,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))


def create_app(hg: Any, config: ServeConfig = ServeConfig(),
               on_shutdown: Callable[[], None] | None = None) -> FastAPI:
    """The API over the open index ``hg`` (see module docstring); ``on_shutdown`` runs after the
    write queue has drained (the CLI closes the index there)."""
    # FAISS files are saved at most every vector_save_s during writes and after a second
    # without one (each save syncs three files); DuckDB commits every write before its answer
    hg.save_vectors_every(config.vector_save_s)
    writer = WriteQueue(config.write_queue, on_idle=hg.flush)
    reads = ReadBatcher(hg.retrieve_many, max_questions=config.read_batch,
                        workers=config.read_workers)

    mcp_app = _mcp_app(hg, config, writer) if config.mcp else None

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if mcp_app is not None:  # its session manager runs as long as the server
            async with mcp_app.router.lifespan_context(mcp_app):
                yield
        else:
            yield
        reads.close()
        writer.close()  # the batches queued or in flight finish before the index closes
        if on_shutdown is not None:
            on_shutdown()

    app = FastAPI(title="hipgraph", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Graph-based retrieval over one index: documents, conversation "
                              "memory, retrieval, answers with citations.")
    app.state.writer = writer
    if mcp_app is not None:
        app.router.routes.extend(mcp_app.routes)  # POST/GET/DELETE /mcp, behind the same token

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if config.token is not None and request.url.path not in PUBLIC_PATHS \
                and not request.url.path.startswith(DOCS_ASSETS):
            sent = request.headers.get("authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {config.token}".encode()):
                return _error(401, "missing or wrong bearer token (Authorization: Bearer ...)")
        return await call_next(request)

    app.add_middleware(BodyLimit, limit=config.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError):
        return _error(422, _field_errors(exc))

    @app.exception_handler(InputError)
    async def bad_input(_request: Request, exc: InputError):
        return _error(422, str(exc))

    @app.exception_handler(ConfigError)
    async def bad_config(_request: Request, exc: ConfigError):
        return _error(422, str(exc))

    @app.exception_handler(QueueFull)
    async def busy(_request: Request, exc: QueueFull):
        return _error(503, f"the write queue is full ({exc}); retry", **{"Retry-After": "1"})

    @app.exception_handler(HipgraphError)
    async def failed(_request: Request, exc: HipgraphError):
        logger.error("request failed: %s", exc)
        return _error(500, f"{type(exc).__name__}: {exc}")

    @app.get("/health")
    def health() -> dict[str, Any]:
        """200 once the index is open and the embedder is loaded."""
        return {"status": "ok", "index": str(hg.path), "read_only": hg.store.read_only,
                "embedder": hg.embedder.name, "pending_writes": writer.pending()}

    @app.get("/v1/stats")
    def stats() -> dict[str, Any]:
        return dict(hg.stats())

    @app.post("/v1/documents")
    def add_documents(body: DocumentsIn) -> dict[str, Any]:
        """Add or replace documents; answered after the batch is committed."""
        records = [d.model_dump() for d in body.documents]
        report = writer.submit(lambda: hg.add_documents(records))
        return report.to_dict()

    @app.get("/v1/documents/{doc_id:path}")
    def get_document(doc_id: str):
        doc = hg.document(doc_id)
        return doc if doc is not None else _error(404, f"no document {doc_id!r}")

    @app.delete("/v1/documents/{doc_id:path}")
    def delete_document(doc_id: str):
        report = writer.submit(lambda: hg.delete_documents([doc_id]))
        return report.to_dict() if report.deleted else _error(404, f"no document {doc_id!r}")

    @app.post("/v1/conversations")
    def add_conversation(body: ConversationIn) -> dict[str, Any]:
        """Add a conversation (the record ``add_conversation`` takes); answered after commit."""
        report = writer.submit(lambda: hg.add_conversation(
            body.conversation, dayfirst=body.dayfirst, date_format=body.date_format))
        return report.to_dict()

    @app.delete("/v1/conversations/{conversation_id:path}")
    def delete_conversation(conversation_id: str):
        report = writer.submit(lambda: hg.delete_conversation(conversation_id))
        return report.to_dict() if report.deleted else _error(404, f"no conversation {conversation_id!r}")

    @app.post("/v1/retrieve")
    def retrieve(body: RetrieveIn):
        """``{"hits": [...]}`` for ``question``, ``{"results": [[...], ...]}`` for ``questions``."""
        if (body.question is None) == (body.questions is None):
            return _error(422, "give either 'question' or 'questions'")
        cfg = hg.retrieval if body.memory_hits is None else hg.retrieval.replace(memory_hits=body.memory_hits)
        if body.question is not None:
            dates = None if body.question_date is None else [body.question_date]
            hits = reads.retrieve([body.question], k=body.k, mode=body.mode, config=cfg,
                                  question_dates=dates, as_of=body.as_of)[0]
            return _json({"hits": [h.to_dict() for h in hits]})
        results = reads.retrieve(body.questions, k=body.k, mode=body.mode, config=cfg,
                                 question_dates=body.question_dates, as_of=body.as_of)
        return _json({"results": [[h.to_dict() for h in hits] for hits in results]})

    @app.post("/v1/answer")
    def answer(body: AnswerIn) -> dict[str, Any]:
        """An answer with citations from the server's generator (``none``: the context only)."""
        return _json(hg.answer(body.question, k=body.k, mode=body.mode, generator=config.generator,
                               question_date=body.question_date, as_of=body.as_of).to_dict())

    @app.get("/v1/graph")
    def graph(question: str, k: int = 5, max_nodes: int = 120):
        """A question's PPR subgraph (seeds, top-k passages, their strongest paths, grown by
        PageRank mass to ``max_nodes``) as nodes and edges (what the explorer page draws)."""
        if not 1 <= k <= MAX_K or not 1 <= max_nodes <= 1000:
            return _error(422, "k must be in 1..1000 and max_nodes in 1..1000")
        return _json(hg.subgraph(question, k=k, max_nodes=max_nodes))

    if config.token is not None:  # the docs page's "Authorize" button sends it
        def openapi_with_bearer() -> dict[str, Any]:
            if app.openapi_schema is None:
                schema = FastAPI.openapi(app)
                schema.setdefault("components", {})["securitySchemes"] = {
                    "bearer": {"type": "http", "scheme": "bearer"}}
                schema["security"] = [{"bearer": []}]
            return app.openapi_schema
        app.openapi = openapi_with_bearer

    @app.get("/docs", include_in_schema=False)
    def docs():
        """Swagger UI over /openapi.json, from the files in the package (no CDN)."""
        return get_swagger_ui_html(
            openapi_url="/openapi.json", title="hipgraph API",
            swagger_js_url=f"{DOCS_ASSETS}swagger-ui-bundle.js", swagger_css_url=f"{DOCS_ASSETS}swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}favicon-32x32.png",
            swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": False})

    @app.get(DOCS_ASSETS + "{name}", include_in_schema=False)
    def docs_asset(name: str):
        """One of the vendored Swagger UI files, by exact name."""
        if name not in SWAGGER_FILES:
            return _error(404, f"no docs asset {name!r}")
        return FileResponse(SWAGGER_UI / name, media_type=SWAGGER_FILES[name],
                            headers={"Cache-Control": "public, max-age=86400"})

    @app.get("/", include_in_schema=False)
    def explorer():
        """The explorer page: a question box, the hits with their why-paths, the subgraph."""
        return HTMLResponse(EXPLORER.read_text(encoding="utf-8"))

    @app.get("/v1/facts")
    def facts(entity: str | None = None, as_of: str | None = None, current_only: bool = False):
        return {"facts": [f.to_dict() for f in hg.facts(entity, as_of=as_of, current_only=current_only)]}

    return app
