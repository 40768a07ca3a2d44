"""`python -m service`: serve the models over HTTP with uvicorn (one worker, see DESIGN.md)."""

from __future__ import annotations

from service import openmp_env

openmp_env.apply()  # before anything imports torch (and with it libgomp)

import argparse
import math
import signal
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from service.api.observability import configure_logging
from service.config_check import settings_or_exit
from service.main import create_app


def parse_args(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m service", description="hookserve: PyTorch models over HTTP")
    parser.add_argument("--config", type=Path, help="models TOML (env HOOKSERVE_CONFIG); default: built-in models")
    parser.add_argument("--model-dir", type=Path, help="root of every server-side path (env HOOKSERVE_MODEL_DIR)")
    parser.add_argument("--host", help="bind address (env HOOKSERVE_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (env HOOKSERVE_PORT, default 8000)")
    parser.add_argument("--device", help="auto | cpu | cuda | cuda:N | mps (env HOOKSERVE_DEVICE)")
    args = parser.parse_args(argv)
    return {k: v for k, v in vars(args).items() if v is not None}


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    """uvicorn re-raises SIGTERM once it has drained (it restores this handler first): exit 0, not -15."""
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> None:
    settings = settings_or_exit(parse_args(argv))  # flags win over the environment; exit 2 naming each problem
    configure_logging(settings.log_level)
    signal.signal(signal.SIGTERM, _exit_cleanly)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,
        access_log=False,
        workers=1,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),
    )


if __name__ == "__main__":
    main()
