"""``hipgraph mcp``: the index as an MCP server over stdio (the official ``mcp`` SDK, 2.x); the
same tools are served over streamable HTTP at ``/mcp`` by ``hipgraph serve``.

Tools (each input schema comes from the signature and docstring below):

- ``remember``: store turns of a conversation as one new session of long-term memory;
- ``add_documents``: add or replace documents (notes, pages);
- ``recall``: retrieve the best turns or passages for a question, optionally as of a date;
- ``answer``: an answer with citations from the generator the server was started with;
- ``stats``: counts of the index.

Every tool returns JSON. Writes are committed before the tool returns. Nothing is printed on
stdout but the protocol (the library logs to stderr).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from typing import Any

from hipgraph.config import GeneratorConfig
from hipgraph.errors import ConfigError, InputError

NO_GENERATOR = GeneratorConfig()


def _hit(h: Any) -> dict[str, Any]:
    out = {"doc_id": h.doc_id, "text": h.text, "score": round(h.score, 6), "rank": h.rank}
    if h.turn_ids:
        out.update({"turn_ids": list(h.turn_ids), "speakers": list(h.speakers),
                    "conversation": h.conversation, "session": h.session, "time": h.time})
    elif h.title:
        out["title"] = h.title
    return out


def _reported(fn):
    """Tool errors the caller can act on (bad input, a bad setting) reach it with their message;
    the SDK would otherwise answer only "Error executing tool ..."."""
    from mcp.server.mcpserver.exceptions import ToolError  # noqa: PLC0415

    @functools.wraps(fn)
    def tool(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (InputError, ConfigError) as exc:
            raise ToolError(str(exc)) from exc
    return tool


def build_server(hg: Any, generator: GeneratorConfig = NO_GENERATOR,
                 write: Callable[[Callable[[], Any]], Any] | None = None):
    """An ``MCPServer`` whose tools read and write ``hg`` (an open, writable index); ``write``
    runs each write call (``hipgraph serve`` passes its single writer's queue)."""
    write = write or (lambda call: call())
    from mcp.server.mcpserver import MCPServer  # noqa: PLC0415

    server = MCPServer("hipgraph", instructions=(
        "Long-term memory and document retrieval. Store what the user says with `remember` "
        "(one call per exchange or session), look things up with `recall` before answering."))

    @server.tool()
    @_reported
    def remember(conversation: str, turns: list[dict[str, str]], session: str | None = None,
                 time: str | None = None) -> dict[str, Any]:
        """Store turns as one new session of the conversation `conversation`.

        `turns`: [{"speaker": "...", "text": "..."}] in order. `session`: its id (default: the
        current UTC time); a session id given again replaces that session. `time`: when it was
        said (ISO 8601 or free text such as "8 May 2023, 10:00"; default now, UTC)."""
        now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        sid = session or now.strftime("%Y%m%dT%H%M%S%f")
        record = {"id": conversation, "sessions": [
            {"id": sid, "time": time or now.isoformat(timespec="seconds"),
             "turns": [{"speaker": t.get("speaker"), "text": t.get("text")} for t in turns]}]}
        report = write(lambda: hg.add_conversation(record))
        return {"session": sid, **report.to_dict()}

    @server.tool()
    @_reported
    def add_documents(documents: list[dict[str, Any]]) -> dict[str, Any]:
        """Add or replace documents: [{"id": "...", "text": "...", "title"?: "...",
        "metadata"?: {...}}]. An unchanged document is skipped."""
        return write(lambda: hg.add_documents(documents)).to_dict()

    @server.tool()
    @_reported
    def recall(question: str, k: int = 5, question_date: str | None = None,
               as_of: str | None = None, mode: str = "graph") -> dict[str, Any]:
        """The `k` best conversation turns or document passages for `question`.

        `question_date`: when the question is asked (resolves "last May"); `as_of`: memory as it
        stood then; `mode`: graph (default), dense, bm25 or hybrid."""
        hits = hg.retrieve(question, k=k, mode=mode, question_date=question_date, as_of=as_of)
        return {"hits": [_hit(h) for h in hits]}

    @server.tool()
    @_reported
    def answer(question: str, question_date: str | None = None) -> dict[str, Any]:
        """An answer to `question` with the turns or passages it cites (with the `none`
        generator: the cited context only)."""
        return hg.answer(question, generator=generator, question_date=question_date).to_dict()

    @server.tool()
    @_reported
    def stats() -> dict[str, Any]:
        """Counts of documents, passages, entities, facts and edges."""
        return dict(hg.stats())

    return server


def run_stdio(db: Any, *, create: bool = False, open_kwargs: dict[str, Any] | None = None,
              generator: GeneratorConfig = NO_GENERATOR) -> None:
    """Open ``db`` and serve it over stdio until the client closes the stream."""
    try:
        import mcp  # noqa: F401, PLC0415
    except ImportError as exc:
        from hipgraph.errors import BackendUnavailableError  # noqa: PLC0415

        raise BackendUnavailableError("hipgraph mcp needs the MCP SDK: pip install 'hipgraph[serve]'") from exc
    import hipgraph  # noqa: PLC0415

    with hipgraph.open(db, create=create, **(open_kwargs or {})) as hg:
        hg.embedder.embed(["warm-up"])
        build_server(hg, generator).run("stdio")
