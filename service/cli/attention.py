"""`hookserve attention`: a vision transformer's attention, as a table of where each head looks, a picture of the
maps over the image, or the probabilities in a file."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from service.cli.output import jsonable, print_json, print_table
from service.cli.remote import (
    ARRAY_SUFFIXES,
    client_options,
    layer_list,
    make_client,
    model_and_inputs,
    output_path,
    read_inputs,
    token_choice,
    write_arrays,
)
from service.client.results import AttentionMaps
from service.client.tensors import Array


def head_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes head indices (0,2); got {text!r}") from None


def cmd_attention(args: argparse.Namespace) -> int:
    out: Path | None = args.output
    output_path(out, (".png", *ARRAY_SUFFIXES))
    blocks = layer_list(args.blocks)
    with make_client(args) as client:
        if out is not None and out.suffix == ".png":
            image = client.attention_image(args.model, Path(args.inputs[0]), blocks=blocks, heads=args.heads)
            image.save(out)
            print(f"wrote {out}")
            return 0
        maps = client.attention(
            args.model, read_inputs(args.inputs), blocks=blocks, heads=args.heads, queries=args.queries
        )
    if out is not None:
        shapes = {k: {"shape": list(a.shape), "dtype": str(a.dtype)} for k, a in maps.maps.items()}
        rest = {k: v for k, v in jsonable(maps).items() if k != "maps"}
        write_arrays(out, maps.maps, rest | {"attention": shapes})
        print_table(["block", "shape", "dtype"], [[k, v["shape"], v["dtype"]] for k, v in shapes.items()])
        print(f"wrote {out}")
        return 0
    if args.json:
        print_json(maps)
        return 0
    print_table(["input", "block", "head", "query", "most attended (probability)"], _rows(args.inputs, maps, args.top))
    return 0


def _rows(inputs: Sequence[str], maps: AttentionMaps[Array], top: int) -> list[list[Any]]:
    """Per input, block, head and query row: the keys it attends to most."""
    rows: list[list[Any]] = []
    names = _key_names(maps)
    for block, found in maps.maps.items():
        for i, name in enumerate(inputs):
            for h, head in enumerate(maps.heads):
                for q, query in enumerate(maps.query_names):
                    probabilities = found[i, h, q]
                    order = np.argsort(-probabilities, kind="stable")[:top]
                    best = ", ".join(f"{names[k]} {probabilities[k]:.3f}" for k in order)
                    rows.append([name, block, head, query, best])
    return rows


def _key_names(maps: AttentionMaps[Array]) -> list[str]:
    count = next(iter(maps.maps.values())).shape[-1] if maps.maps else 0
    if maps.tokens is None:
        return [str(k) for k in range(count)]
    prefix, (_, cols) = maps.tokens.prefix, maps.tokens.grid
    return [*prefix, *(f"r{(k - len(prefix)) // cols}c{(k - len(prefix)) % cols}" for k in range(len(prefix), count))]


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    text = "a vision transformer's attention: where each head looks, -o .png (maps over the image) or arrays"
    p = commands.add_parser("attention", parents=[client_options()], help=text, description=text)
    p.set_defaults(handler=cmd_attention)
    model_and_inputs(p)
    p.add_argument(
        "-b", "--blocks", action="append", default=[], help="blocks or attention modules, comma-separated (default all)"
    )
    p.add_argument("--heads", type=head_list, help="head indices, comma-separated (default all)")
    p.add_argument(
        "-q",
        "--queries",
        type=token_choice,
        help="query tokens: 0,3, all, patches or prefix (default: the class token)",
    )
    p.add_argument("--top", type=int, default=3, help="keys shown per head and query (default 3)")
    p.add_argument("-o", "--output", type=Path, help="write .png (the first input's maps) or .safetensors / .npz")
