"""`python -m service`: serve the models over HTTP with uvicorn (one worker, see DESIGN.md).

The settings and the models TOML are checked before uvicorn, FastAPI and torch are imported, so a
mistyped config is answered in about a second rather than after the whole server has been imported."""

from __future__ import annotations

from service import openmp_env

openmp_env.apply()  # before anything imports torch (and with it libgomp)

import argparse
import atexit
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from service.cli.check import server_flags
from service.config import Settings
from service.config_check import settings_or_exit

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

SETTLE_S = 0.5  # how long threads the server started may take to end once it stopped, before it leaves without them
CUT_MARGIN_S = 2  # uvicorn's own cancel, a backstop after the notice has answered what was still running
log = logging.getLogger("hookserve")


def parse_args(argv: Sequence[str] | None = None, prog: str = "python -m service") -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog=prog, description="hookserve: PyTorch models over HTTP")
    server_flags(parser)
    args = parser.parse_args(argv)
    return {k: v for k, v in vars(args).items() if v is not None}


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    """uvicorn re-raises SIGTERM once it has drained (it restores this handler first): exit 0, not -15."""
    raise SystemExit(0)


def exit_past_stragglers(existing: set[threading.Thread], code: int = 0, settle_s: float = SETTLE_S) -> None:
    """Leave at once if threads the server started after `existing` still run `settle_s` after it stopped: a job
    cut at the grace period still inside torch, a load that never returned, or a decode or encoding still busy on
    the decode pool.

    At interpreter exit, model threads (daemons) can crash the process mid-forward (SIGSEGV), and the decode
    pool's threads (not daemons) are waited for however long their work takes (a slow decode held a 1 s grace
    period's exit for 13 s); their requests were answered already, so nothing is lost by not waiting for them.
    Idle pool threads end within `settle_s` once their pool is shut down."""
    deadline = time.monotonic() + settle_s
    ours = [t for t in threading.enumerate() if t not in existing and t.name.startswith("hookserve-")]
    for thread in ours:
        thread.join(max(0.0, deadline - time.monotonic()))
    stragglers = [t.name for t in ours if t.is_alive()]  # enumerate lists live threads
    if not stragglers:
        return
    log.warning("exiting with %d server thread(s) still running: %s", len(stragglers), ", ".join(stragglers))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def configure_logging(level: str) -> None:
    from service.api.observability import configure_logging as configure

    configure(level)


def create_app(settings: Settings) -> FastAPI:
    """`service.main.create_app`, imported once the settings have passed their checks."""
    from service.main import create_app as build

    return build(settings)


def uvicorn_config(app: FastAPI, settings: Settings) -> uvicorn.Config:
    import uvicorn

    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,
        access_log=False,
        workers=1,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s) + CUT_MARGIN_S,
    )


def serve(app: FastAPI, settings: Settings) -> None:
    """Serve `app` until SIGTERM or SIGINT, then leave without waiting for threads it started or for the
    interpreter's teardown."""
    from service.api.shutdown import GracefulServer

    server = GracefulServer(uvicorn_config(app, settings), app.state.shutdown_notice, settings.shutdown_grace_s)
    existing = set(threading.enumerate())
    code = 0
    try:
        server.run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    exit_past_stragglers(existing, code)
    leave(code)


def leave(code: int) -> None:
    """Exit once the server has stopped: atexit handlers run and output is flushed, but the interpreter's own
    teardown is skipped (freeing every module and resident model one object at a time took ~2 s of a 1 s grace
    period's exit)."""
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None, prog: str = "python -m service") -> None:
    settings = settings_or_exit(parse_args(argv, prog))  # flags win over the environment; exit 2 naming each problem
    configure_logging(settings.log_level)
    signal.signal(signal.SIGTERM, _exit_cleanly)
    serve(create_app(settings), settings)


if __name__ == "__main__":
    main()
