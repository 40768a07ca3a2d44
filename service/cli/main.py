"""`hookserve`: serve models, or ask a running server from the shell.

    hookserve serve --config models.toml          # the server: exactly `python -m service`
    hookserve check --config models.toml          # validate the config, load nothing (exit 2 on problems)
    hookserve predict lenet digit.png             # a table for a person; --json for scripts
    hookserve attention vit_digits digit.png      # where each head of a vision transformer looks
    hookserve features lenet digits/ -l fc1 -o features/
    hookserve jobs start unit_stats lenet digits -l conv1 --wait   # a data-set job on the server (admin token)

`hookserve` alone prints this help; `hookserve` with only server flags (`--config ...`) serves, as it always has.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from service import __version__
from service.cli import attention, check, features, gradients, interventions, jobs, remote
from service.cli.errors import (
    EXIT_CODES,
    EXIT_INTERRUPTED,
    EXIT_LOCAL,
    EXIT_PIPE,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
    report,
    server_error_text,
)
from service.cli.parsing import Parser
from service.client.errors import HookserveError, TransportError

HELP = ("-h", "--help", "--version")


def serve(argv: Sequence[str]) -> int:
    """Today's server: `python -m service` with the same flags and environment (imported only here)."""
    from service.__main__ import main as serve_main

    serve_main(list(argv), prog="hookserve serve")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = Parser(
        prog="hookserve",
        description="hookserve: PyTorch models over HTTP. `serve` runs the server; the other commands ask one.",
        epilog="exit status: " + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items()),
    )
    parser.add_argument("--version", action="version", version=f"hookserve {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    text = "run the server (the flags of `python -m service`: --config, --model-dir, --host, --port, --device)"
    commands.add_parser("serve", help=text, description=text, add_help=False)
    check.add_parser(commands)
    remote.add_parsers(commands)
    gradients.add_parser(commands)
    interventions.add_parsers(commands)
    attention.add_parser(commands)
    features.add_parser(commands)
    jobs.add_parser(commands)
    return parser


def command_names() -> list[str]:
    """Every command `hookserve --help` lists, in its order."""
    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return [name for action in actions for name in action.choices]


def run(argv: Sequence[str] | None = None) -> int:
    """The exit status: see `EXIT_CODES` (0 done, 1 a local file, 2 usage or config, 3 the server refused,
    4 no server answered, 130 interrupted)."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    if not args:
        build_parser().print_help()
        return 0
    if args[0].startswith("-") and args[0] not in HELP:
        return serve(args)
    if args[0] == "serve":
        return serve(args[1:])
    parser = build_parser()
    try:
        parsed = parser.parse_args(args)
        status: int = parsed.handler(parsed)
    except CliError as exc:
        return report(exc.code, str(exc), as_json, usage=exc.usage)
    except TransportError as exc:
        where = getattr(parsed, "url", "the server")
        return report(EXIT_UNREACHABLE, f"no answer from {where}: {exc}", as_json)
    except HookserveError as exc:
        text = server_error_text(exc, getattr(parsed, "inputs", None))
        return report(EXIT_REFUSED, text, as_json, status=exc.status, errors=exc.errors)
    except BrokenPipeError:  # `hookserve ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    except (OSError, ValueError) as exc:  # unreadable inputs, a mismatching output directory, ...
        return report(EXIT_LOCAL, str(exc), as_json)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return status


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(run(argv))


__all__ = ["EXIT_USAGE", "build_parser", "command_names", "main", "run"]

if __name__ == "__main__":
    main()
