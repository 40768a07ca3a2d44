"""`--dry-run` for the commands that run a model: print what the request would cost, run nothing."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from service.cli.output import print_json, print_table
from service.client import Client
from service.client.inputs import Input


def add_dry_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print what the request would cost (memory, forwards, seconds, whether it would be admitted); run nothing",
    )


def print_estimate(
    args: argparse.Namespace,
    client: Callable[[argparse.Namespace], Client],
    path: str,
    inputs: Sequence[Input],
    fields: Mapping[str, Any],
) -> int:
    """Send the request to `path` as a dry run and print its estimate (a table, or JSON with --json)."""
    given = {key: value for key, value in fields.items() if value is not None}
    with client(args) as session:
        found = session.estimate(path, args.model, list(inputs), **given)
    if args.json:
        print_json(found)
        return 0
    rows: list[list[Any]] = [
        ["memory (bytes)", found.memory_bytes],
        *([f"  {part}", size] for part, size in found.memory_parts.items()),
        ["memory limit (bytes)", found.memory_limit_bytes],
        ["forwards", found.forwards],
        ["backwards", found.backwards],
        ["seconds", found.seconds],
        ["deadline (s)", found.deadline_s],
        ["rows per forward", found.rows_per_forward],
        ["admitted", found.admitted],
        ["would wait", found.would_wait],
    ]
    if found.refusal:
        rows.append(["refusal", found.refusal])
    print_table(["estimate", "value"], rows)
    return 0
