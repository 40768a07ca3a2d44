"""`hookserve gradients`: d(target logit)/d(layer outputs) and d/d(input), as statistics or -o to a file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from service.cli.output import print_json, print_table
from service.cli.remote import (
    ARRAY_SUFFIXES,
    client_options,
    layer_list,
    make_client,
    model_and_inputs,
    output_path,
    parse_target,
    read_inputs,
    write_arrays,
    wrote,
)
from service.client.tensors import Array


def gradient_stats(gradient: Array) -> dict[str, Any]:
    """What a person compares between layers: the shape, the signed range and mean, the mean size, the L2 norm."""
    values = np.asarray(gradient, dtype=np.float64)
    return {
        "shape": list(gradient.shape),
        "min": float(values.min()),
        "max": float(values.max()),
        "mean": float(values.mean()),
        "mean_abs": float(np.abs(values).mean()),
        "l2": float(np.sqrt((values * values).sum())),
    }


def cmd_gradients(args: argparse.Namespace) -> int:
    out: Path | None = args.output
    output_path(out, ARRAY_SUFFIXES)
    with make_client(args) as client:
        result = client.gradients(
            args.model,
            read_inputs(args.inputs),
            target=parse_target(args.target),
            layers=layer_list(args.layers),
            include_input=not args.no_input,
        )
    head = {"model": result.model, "targets": result.targets, "scores": result.scores}
    if out is not None:
        shapes = {k: {"shape": list(a.shape), "dtype": str(a.dtype)} for k, a in result.gradients.items()}
        write_arrays(out, result.gradients, head | {"gradients": shapes})
        return wrote(args, out, shapes)
    stats = {name: gradient_stats(g) for name, g in result.gradients.items()}
    if args.json:
        print_json(head | {"gradients": stats})
        return 0
    print_table(
        ["input", "target", "score"],
        [[name, t, s] for name, t, s in zip(args.inputs, result.targets, result.scores, strict=True)],
    )
    print()
    rows = [[k, s["shape"], s["min"], s["max"], s["mean"], s["mean_abs"], s["l2"]] for k, s in stats.items()]
    print_table(["gradient", "shape", "min", "max", "mean", "mean |g|", "L2 norm"], rows)
    return 0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    text = "gradients of the target logit with respect to layer outputs and the input: statistics, or -o arrays"
    p = commands.add_parser("gradients", parents=[client_options()], help=text, description=text)
    p.set_defaults(handler=cmd_gradients)
    model_and_inputs(p)
    p.add_argument(
        "-l", "--layers", action="append", default=[], help="module paths or patterns, comma-separated (default: none)"
    )
    p.add_argument("-t", "--target", help="class index or label, or one per input comma-separated (default: top-1)")
    p.add_argument("--no-input", action="store_true", help="leave out the gradient with respect to the input")
    p.add_argument("-o", "--output", type=Path, help="write every gradient to .safetensors or .npz")
