"""`hookserve interventions` (edit activations in one forward, see what changes) and `hookserve sweep` (ablate each
channel or head of a site in turn, ranked by how much the target score needs it)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from service.cli.errors import usage_error
from service.cli.output import print_json, print_table
from service.cli.remote import client_options, layer_list, make_client, model_and_inputs, parse_target, read_inputs


def edit_items(text: str) -> list[dict[str, Any]]:
    """`-e '{"site": "conv2", "op": "zero", "channels": [15]}'` (one edit or a list), or `-e @edits.json`."""
    source = Path(text[1:]).read_text() if text.startswith("@") else text
    try:
        value = json.loads(source)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"takes a JSON edit or list of edits, or @FILE.json ({exc})") from None
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(item, dict) for item in items):
        raise argparse.ArgumentTypeError('takes JSON objects like {"site": "conv2", "op": "zero"}')
    return items


def span(text: str) -> tuple[int, int]:
    """`0,16` -> (0, 16): a [start, stop) range."""
    try:
        start, stop = (int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes START,STOP (e.g. 0,16); got {text!r}") from None
    return start, stop


def cmd_interventions(args: argparse.Namespace) -> int:
    edits = [edit for group in args.edits for edit in group]
    with make_client(args) as client:
        result = client.interventions(
            args.model,
            read_inputs(args.inputs),
            edits,
            target=parse_target(args.target),
            layers=layer_list(args.layers),
        )
    if args.json:
        print_json({k: v for k, v in vars(result).items() if k != "activations"} | {"inputs": args.inputs})
        return 0
    rows = [
        [name, c.label, c.clean_score, c.edited_score, c.delta, c.kl_divergence, before.top1.label, after.top1.label]
        for name, c, before, after in zip(args.inputs, result.change, result.clean, result.edited, strict=True)
    ]
    headers = ["input", "target", "clean score", "edited score", "delta", "KL", "top-1 before", "top-1 after"]
    print_table(headers, rows)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.over == "channels" and args.heads is not None:
        usage_error("--heads ranges the heads of --over heads; --channels ranges channels")
    with make_client(args) as client:
        result = client.sweep(
            args.model,
            read_inputs(args.inputs),
            args.site,
            call=args.call,
            op=args.op,
            channels=args.channels,
            target=parse_target(args.target),
            over=args.over,
            heads=args.heads,
        )
    if args.json:
        print_json(result)
        return 0
    effects: list[tuple[int, float, list[float]]] = (
        [(h.head, h.delta, h.deltas) for h in result.heads]
        if result.over == "heads" and result.heads
        else [(c.channel, c.delta, c.deltas) for c in result.channels]
    )
    rows = [[rank, *effect] for rank, effect in enumerate(effects, 1)]
    shown = rows if args.top is None else rows[: args.top]
    print_table(["rank", result.over.rstrip("s"), "mean delta", "delta per input"], shown)
    if len(shown) < len(rows):
        print(f"... {len(rows) - len(shown)} more (--top {len(rows)} or --json shows every one)")
    return 0


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    text = "edit activations in one forward (zero, scale, add, clamp, mean, noise, patch, set): what the edits change"
    p = commands.add_parser("interventions", parents=[client_options()], help=text, description=text)
    p.set_defaults(handler=cmd_interventions)
    model_and_inputs(p)
    p.add_argument(
        "-e",
        "--edit",
        dest="edits",
        action="append",
        type=edit_items,
        required=True,
        metavar="JSON",
        help='an edit as the API takes it, e.g. \'{"site": "conv2", "op": "zero", "channels": [15]}\' (repeatable), '
        "or @FILE.json holding a list",
    )
    p.add_argument("-t", "--target", help="class index or label, or one per input comma-separated (default: top-1)")
    p.add_argument("-l", "--layers", action="append", default=[], help="capture these layers after the edits (--json)")

    text = "ablate each channel (or attention head) of a site in turn: ranked by the change of the target score"
    p = commands.add_parser("sweep", parents=[client_options()], help=text, description=text)
    p.set_defaults(handler=cmd_sweep)
    model_and_inputs(p)
    p.add_argument(
        "-s", "--site", required=True, help="a module path (`hookserve layers`), e.g. conv2 or blocks.3.attn"
    )
    p.add_argument("--op", choices=["zero", "mean"], default="zero", help="how a channel or head is ablated")
    p.add_argument("--over", choices=["channels", "heads"], default="channels", help="what is ablated in turn")
    p.add_argument("--channels", type=span, metavar="START,STOP", help="only these channels (default: all)")
    p.add_argument("--heads", type=span, metavar="START,STOP", help="--over heads: only these heads (default: all)")
    p.add_argument("--call", type=int, default=1, help="which call of a module that runs several times")
    p.add_argument("-t", "--target", help="class index or label, or one per input comma-separated (default: top-1)")
    p.add_argument("--top", type=int, help="rows shown (default: every one)")
