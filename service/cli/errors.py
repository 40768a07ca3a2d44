"""How the command line fails: one line (or one JSON object under --json), the closest valid spelling when there
is one, and an exit status a script can branch on."""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from service.cli.output import print_json
from service.client.errors import HookserveError

EXIT_OK = 0
EXIT_LOCAL = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_UNREACHABLE = 4
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141
EXIT_CODES = {
    EXIT_OK: "done",
    EXIT_LOCAL: "a local file could not be read or written",
    EXIT_USAGE: "bad usage, or a config that does not check",
    EXIT_REFUSED: "the server answered with an error",
    EXIT_UNREACHABLE: "no server answered",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}


class CliError(Exception):
    """A failure the command line explains itself, with its exit status."""

    def __init__(self, message: str, code: int = EXIT_USAGE, usage: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.usage = usage


def usage_error(message: str) -> NoReturn:
    raise CliError(message, EXIT_USAGE)


def closest(value: str, choices: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def report(
    code: int,
    message: str,
    as_json: bool,
    *,
    status: int | None = None,
    errors: Sequence[dict[str, Any]] = (),
    usage: str | None = None,
) -> int:
    """Print a failure and return its exit status: `hookserve: error: ...` on stderr, or under --json an object
    `{"error": {"exit": 3, "status": 422, "message": ..., "errors": [...]}}` on stdout."""
    if as_json:
        print_json({"error": {"exit": code, "status": status, "message": message, "errors": list(errors)}})
        return code
    if usage:
        print(usage.rstrip(), file=sys.stderr)
    print(f"hookserve: error: {message}", file=sys.stderr)
    return code


def server_error_text(exc: HookserveError, inputs: Sequence[str] | None) -> str:
    """The server's words, for a person at a shell: input indices named by their file, `hookserve models` for
    the list of models."""
    text = f"{exc.status} {exc.detail}" if exc.status is not None else exc.detail
    text = text.replace("GET /models lists them", "`hookserve models` lists them")
    if inputs:

        def named(match: re.Match[str]) -> str:
            index = int(match.group(2))
            return f"{match.group(0)} ({inputs[index]})" if index < len(inputs) else match.group(0)

        text = re.sub(r"\b(image|inputs)\[(\d+)\]", named, text)
    return text
