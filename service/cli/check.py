"""`hookserve check`: the start-up validation of `python -m service`, alone, for CI pipelines, and more: each model
built on the meta device (kwargs, weights keys and shapes, a forward at its input size; no memory, no weights read),
the host and port bound, the model dir present."""

from __future__ import annotations

import argparse
from pathlib import Path

from service.cli.output import print_json


def server_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of `python -m service` (env HOOKSERVE_* when absent; flags win)."""
    parser.add_argument("--config", type=Path, help="models TOML (env HOOKSERVE_CONFIG); default: built-in models")
    parser.add_argument("--model-dir", type=Path, help="root of every server-side path (env HOOKSERVE_MODEL_DIR)")
    parser.add_argument("--host", help="bind address (env HOOKSERVE_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (env HOOKSERVE_PORT, default 8000)")
    parser.add_argument("--device", help="auto | cpu | cuda | cuda:N | mps (env HOOKSERVE_DEVICE)")


def cmd_check(args: argparse.Namespace) -> int:
    from service.config_check import EXIT_INVALID, check  # the server's own validation, imported when used

    flags = {k: getattr(args, k) for k in ("config", "model_dir", "host", "port", "device")}
    result = check({k: v for k, v in flags.items() if v is not None}, thorough=True)
    if args.json:
        problems = [{"where": p.where, "message": p.message} for p in result.problems]
        print_json({"ok": not result.problems, "models": result.models, "problems": problems})
    elif result.problems:
        for problem in result.problems:
            print(problem)
    else:
        settings = result.settings
        source = str(settings.config) if settings is not None and settings.config is not None else "built-in models"
        models = f" ({', '.join(result.models)})" if result.models else ""
        print(f"ok: {source}{models}")
    return EXIT_INVALID if result.problems else 0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    text = (
        "validate the settings and the models TOML as the server does at start-up, and build each model on the meta "
        "device (kwargs, weights keys and shapes, input size) and bind the host and port, loading no weights"
    )
    parser = commands.add_parser("check", help=text, description=text)
    server_flags(parser)
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.set_defaults(handler=cmd_check)
