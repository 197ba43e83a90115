"""``hipgraph serve``: one process owns an index and serves it over HTTP/JSON (:mod:`.app`),
writes through a single queue (:mod:`.writer`). Needs the ``serve`` extra (FastAPI, uvicorn)."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
from pathlib import Path
from typing import Any

from hipgraph.errors import BackendUnavailableError, ConfigError

logger = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_from_env(name: str | None, host: str) -> str | None:
    """The bearer token in environment variable ``name``; one is required off loopback."""
    if name is None:
        if not is_loopback(host):
            raise ConfigError(f"serving on {host} (not loopback) needs a bearer token: "
                              "--token-env VAR, with the token in that environment variable")
        return None
    token = os.environ.get(name)
    if not token:
        raise ConfigError(f"--token-env {name}: the environment variable is not set or empty")
    return token


def serve(db: Path, *, host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
          create: bool = False, open_kwargs: dict[str, Any] | None = None, **config: Any) -> None:
    """Open the index at ``db`` (loading its models), then serve it until SIGINT/SIGTERM; the
    writes in flight finish and the index closes cleanly."""
    try:
        import uvicorn  # noqa: PLC0415
    except ImportError as exc:
        raise BackendUnavailableError(
            "hipgraph serve needs FastAPI and uvicorn: pip install 'hipgraph[serve]'") from exc
    import hipgraph  # noqa: PLC0415
    from hipgraph.serve.app import ServeConfig, create_app  # noqa: PLC0415

    settings = ServeConfig(token=token, loopback=is_loopback(host), **config)
    hg = hipgraph.open(db, create=create, **(open_kwargs or {}))
    try:
        warm_up(hg)  # /health answers once the models are loaded
        app = create_app(hg, settings, on_shutdown=hg.close)
        logger.info("serving %s on http://%s:%d", db, host, port)
        _graceful(uvicorn.Config(app, host=host, port=port, log_level="warning",
                               timeout_graceful_shutdown=60)).run()
    finally:
        hg.close()


def warm_up(hg: Any) -> None:
    """Load what the first requests would otherwise wait for: the embedder (and its ONNX
    session), the query-time spaCy parser and the read view (one graph retrieval), and for a
    writable index the extractor, so the first write does not load spaCy."""
    from hipgraph.errors import SessionConfigError  # noqa: PLC0415

    hg.embedder.embed(["warm-up"])
    hg.retrieve("warm-up", k=1)
    if not hg.store.read_only:
        with contextlib.suppress(SessionConfigError):  # writes will say what is missing
            hg.indexer.extractor.extract([])


def _graceful(config):
    """uvicorn's server, ending with exit status 0 after a graceful SIGTERM/SIGINT shutdown
    (uvicorn re-raises the signal once it has shut down, which ends the process as killed)."""
    import uvicorn  # noqa: PLC0415

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            previous = {sig: signal.signal(sig, lambda s, _f: self.handle_exit(s, None))
                        for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server(config)
