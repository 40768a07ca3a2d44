"""`hookserve`: serve models, or ask a running server from the shell.

    hookserve serve --config models.toml          # the server: exactly `python -m service`
    hookserve check --config models.toml          # validate the config, load nothing (exit 2 on problems)
    hookserve predict lenet digit.png             # a table for a person; --json for scripts
    hookserve attention vit_digits digit.png      # where each head of a vision transformer looks
    hookserve features lenet digits/ -l fc1 -o features/

`hookserve` with only server flags (or none) serves, as it always has.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from service import __version__
from service.cli import attention, check, features, remote
from service.client.errors import HookserveError, TransportError, detail_text

HELP = ("-h", "--help", "--version")


def serve(argv: Sequence[str]) -> int:
    """Today's server: `python -m service` with the same flags and environment (imported only here)."""
    from service.__main__ import main as serve_main

    serve_main(list(argv))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hookserve",
        description="hookserve: PyTorch models over HTTP. `serve` runs the server; the other commands ask one.",
    )
    parser.add_argument("--version", action="version", version=f"hookserve {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands.add_parser(
        "serve",
        help="run the server (the flags of `python -m service`: --config, --model-dir, --host, --port, --device)",
    )
    check.add_parser(commands)
    remote.add_parsers(commands)
    attention.add_parser(commands)
    features.add_parser(commands)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """The exit status: 0 done, 1 the server answered an error or could not be reached, 2 bad usage or config."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or (args[0].startswith("-") and args[0] not in HELP):
        return serve(args)
    if args[0] == "serve":
        return serve(args[1:])
    parsed = build_parser().parse_args(args)
    try:
        status: int = parsed.handler(parsed)
    except TransportError as exc:
        print(f"hookserve: error: no answer from {getattr(parsed, 'url', 'the server')}: {exc}", file=sys.stderr)
        return 1
    except HookserveError as exc:
        status_text = f"{exc.status} " if exc.status is not None else ""
        print(f"hookserve: error: {status_text}{detail_text(exc.detail)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `hookserve ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (OSError, ValueError) as exc:  # unreadable inputs, a mismatching output directory, ...
        print(f"hookserve: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return status


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
