"""The server commands of the CLI: ``hipgraph serve`` (HTTP/JSON) and ``hipgraph mcp`` (stdio)."""

from __future__ import annotations

import argparse

from hipgraph.cli_options import (
    add_db,
    add_embedder,
    add_generator,
    add_output,
    add_retrieval,
    generator_config,
    retrieval_config,
    session_embedder,
)
from hipgraph.errors import InputError


def add_server_commands(sub) -> None:
    """The ``serve`` and ``mcp`` sub-commands."""
    p = sub.add_parser("serve", help="serve one index over HTTP/JSON: documents, conversations, "
                                     "retrieve, answer, facts, stats (needs the serve extra)")
    add_db(p)
    add_embedder(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--token-env", default=None,
                   help="environment variable holding the bearer token every request must carry "
                        "(required when --host is not loopback)")
    p.add_argument("--create", action="store_true", help="create the index when it does not exist")
    p.add_argument("--write-queue", type=int, default=64,
                   help="writes waiting at most; a write beyond them is answered 503 with Retry-After")
    p.add_argument("--max-body-mb", type=int, default=64, help="largest request body (MiB)")
    _add_answering_and_retrieval(p, "answering (/v1/answer)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("mcp", help="serve one index as an MCP server over stdio: remember, "
                                   "add_documents, recall, answer, stats (needs the serve extra)")
    add_db(p)
    add_embedder(p)
    p.add_argument("--create", action="store_true", help="create the index when it does not exist")
    _add_answering_and_retrieval(p, "answering (the answer tool)")
    p.set_defaults(func=cmd_mcp)


def _add_answering_and_retrieval(p: argparse.ArgumentParser, title: str) -> None:
    add_generator(p.add_argument_group(title))
    add_retrieval(p)
    add_output(p)


def _open_kwargs(args: argparse.Namespace) -> dict:
    """``hipgraph.open`` arguments from the session's embedder and retrieval flags."""
    kwargs = {"embedder": session_embedder(args)}
    config = retrieval_config(args)
    if config is not None:
        kwargs["retrieval"] = config
    return kwargs


def cmd_serve(args: argparse.Namespace) -> int:
    from hipgraph.serve import serve, token_from_env  # noqa: PLC0415

    if not 0 < args.port < 65536:
        raise InputError(f"--port must be in 1..65535, got {args.port}")
    token = token_from_env(args.token_env, args.host)
    serve(args.db, host=args.host, port=args.port, token=token, create=args.create,
          open_kwargs=_open_kwargs(args), write_queue=args.write_queue,
          max_body_bytes=args.max_body_mb * 1024 * 1024, generator=generator_config(args))
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    from hipgraph.serve.mcp_server import run_stdio  # noqa: PLC0415

    run_stdio(args.db, create=args.create, open_kwargs=_open_kwargs(args), generator=generator_config(args))
    return 0
