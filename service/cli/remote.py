"""The commands that ask a running server: models, predict, activations, saliency, layers, nodes, summary,
inspect, load, unload. Each is a thin layer over `service.client.Client`: parse flags, call, print."""

from __future__ import annotations

import argparse
import json
import os
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from service.cli.errors import EXIT_LOCAL, CliError, usage_error
from service.cli.estimate import add_dry_run, print_estimate
from service.cli.output import jsonable, print_json, print_table
from service.client import Client, Retry
from service.client.base import DEFAULT_URL
from service.client.inputs import Input
from service.client.results import Prediction
from service.client.tensors import Array

URL_ENV = "HOOKSERVE_URL"
ARRAY_SUFFIXES = (".safetensors", ".npz")

Handler = Callable[[argparse.Namespace], int]


def client_options() -> argparse.ArgumentParser:
    """--url, --timeout, --retries, --json: shared by every command that talks to a server."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("server")
    group.add_argument(
        "--url",
        default=os.environ.get(URL_ENV, DEFAULT_URL),
        help=f"the server (env {URL_ENV}); admin calls send $HOOKSERVE_ADMIN_TOKEN",
    )
    group.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    group.add_argument("--retries", type=int, default=5, help="retries of a 503 (queue full), honouring Retry-After")
    group.add_argument(
        "--json", action="store_true", help="print JSON for scripts instead of a table (errors too, on stdout)"
    )
    return parent


def server_url(url: str) -> str:
    """`--url` as given, refused (exit 2) when it names no http:// or https:// scheme, with the spelling meant."""
    if url.startswith(("http://", "https://")):
        return url
    bare = url.rsplit("://", maxsplit=1)[-1]
    usage_error(f"--url {url!r} has no http:// or https://; did you mean 'http://{bare}'?")


def make_client(args: argparse.Namespace) -> Client:
    return Client(server_url(args.url), timeout=args.timeout, retry=Retry(max_retries=args.retries))


def read_inputs(paths: Sequence[str]) -> list[Input]:
    """Image files as they are; `.npy` files as preprocessed sample tensors."""
    return [np.load(p, allow_pickle=False) if p.endswith(".npy") else Path(p) for p in paths]


def layer_list(values: Sequence[str]) -> list[str]:
    """`-l conv1,fc3 -l layer4.*` -> ["conv1", "fc3", "layer4.*"]."""
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


def parse_target(text: str | None) -> int | str | list[int | str] | None:
    """`7` -> 7, `cat` -> "cat", `3,5` -> [3, 5] (one per input)."""
    if text is None:
        return None
    items: list[int | str] = [int(t) if t.strip().lstrip("-").isdigit() else t.strip() for t in text.split(",")]
    return items[0] if len(items) == 1 else items


def param_item(item: str) -> tuple[str, Any]:
    """`window=[8,8]` -> ("window", [8, 8]); a VALUE that is not JSON stays text (`baseline=blur`)."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"takes KEY=VALUE (got {item!r})")
    try:
        return key.strip(), json.loads(text)
    except json.JSONDecodeError:
        return key.strip(), text


def token_choice(text: str) -> list[int] | str:
    """`0,3` -> [0, 3]; the words `patches`, `prefix` and `all` stay words."""
    if text in ("all", "patches", "prefix"):
        return text
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes token indices (0,3), patches or prefix; got {text!r}") from None


def write_arrays(path: Path, tensors: dict[str, Array], response: dict[str, Any]) -> None:
    """Tensors to `.safetensors` or `.npz`, with the rest of the answer as the server writes it (API.md)."""
    text = json.dumps(response)
    if path.suffix == ".npz":
        np.savez(path, allow_pickle=False, __response__=np.array(text), **tensors)
    else:
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata={"response": text})


def output_path(path: Path | None, allowed: Sequence[str]) -> None:
    """Refuse an `-o` the answer could not be written to, before the server does the work: a suffix not in
    `allowed` (exit 2), a folder that does not exist (exit 1)."""
    if path is None:
        return
    if path.suffix not in allowed:
        usage_error(f"-o must end in {', '.join(allowed)} (got {path.name!r})")
    if not path.parent.is_dir():
        raise CliError(f"-o {path}: no folder {str(path.parent)!r}; create it first", EXIT_LOCAL)


def _prediction_rows(inputs: Sequence[str], predictions: Sequence[Prediction]) -> list[list[Any]]:
    return [
        [name, rank, s.label, s.index, s.score]
        for name, p in zip(inputs, predictions, strict=True)
        for rank, s in enumerate(p.top_k, start=1)
    ]


# ---- commands ---------------------------------------------------------------------------------


def cmd_models(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        if args.name:
            info = client.model(args.name)
            if args.json:
                print_json(info.to_json())
                return 0
            fields = {k: v for k, v in info.to_json().items() if k != "repr"}
            print_table(["field", "value"], [[k, v] for k, v in fields.items()])
            if info.repr:
                print()
                print(info.repr)
            return 0
        infos = client.models()
    if args.json:
        print_json([i.to_json() for i in infos])
        return 0
    rows = [
        [i.name, i.status, i.source, i.architecture, i.device, i.weights, i.num_parameters, i.error or ""]
        for i in infos
    ]
    print_table(["name", "status", "source", "architecture", "device", "weights", "parameters", "error"], rows)
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    if args.dry_run:
        return print_estimate(args, make_client, "/predict", read_inputs(args.inputs), {"top_k": args.top_k})
    with make_client(args) as client:
        result = client.predict(args.model, read_inputs(args.inputs), top_k=args.top_k, include_logits=args.logits)
    if args.json:
        print_json({"model": result.model, "inputs": args.inputs, "predictions": result.predictions})
        return 0
    print_table(["input", "rank", "label", "index", "score"], _prediction_rows(args.inputs, result.predictions))
    return 0


def cmd_activations(args: argparse.Namespace) -> int:
    out: Path | None = args.output
    output_path(out, (*ARRAY_SUFFIXES, ".png"))
    layers = layer_list(args.layers)
    inputs = read_inputs(args.inputs)
    if args.dry_run:
        fields = {"layers": layers, "capture": args.capture, "reduce": args.reduce, "format": "stats"}
        return print_estimate(args, make_client, "/activations", inputs, fields)
    with make_client(args) as client:
        if out is not None and out.suffix == ".png":
            client.activations_image(args.model, Path(args.inputs[0]), layers[0], channels=args.channels).save(out)
            return wrote(args, out, {})
        if out is not None:
            acts = client.activations(
                args.model, inputs, layers, capture=args.capture, reduce=args.reduce, tokens=args.tokens
            )
            shapes = {k: {"shape": list(a.shape), "dtype": str(a.dtype)} for k, a in acts.flat().items()}
            response = {"model": acts.model, "predictions": acts.predictions, "activations": shapes}
            write_arrays(out, acts.flat(), jsonable(response))
            return wrote(args, out, shapes)
        stats = client.activation_stats(
            args.model, inputs, layers, capture=args.capture, reduce=args.reduce, tokens=args.tokens
        )
    if args.json:
        print_json(stats)
        return 0
    rows = [
        [layer, side, s.shape, s.min, s.max, s.mean, s.std, s.zero_fraction]
        for layer, sides in stats.stats.items()
        for side, s in sides.items()
    ]
    print_table(["layer", "side", "shape", "min", "max", "mean", "std", "zero fraction"], rows)
    return 0


def wrote(args: argparse.Namespace, path: Path, tensors: dict[str, dict[str, Any]]) -> int:
    if args.json:
        print_json({"file": str(path), "tensors": tensors})
        return 0
    if tensors:
        print_table(["tensor", "shape", "dtype"], [[k, v["shape"], v["dtype"]] for k, v in tensors.items()])
    print(f"wrote {path}")
    return 0


def cmd_saliency(args: argparse.Namespace) -> int:
    out: Path | None = args.output
    output_path(out, (*ARRAY_SUFFIXES, ".png"))
    options: dict[str, Any] = {
        "method": args.method,
        "target": parse_target(args.target),
        "layer": args.layer,
        "steps": args.steps,
        "samples": args.samples,
        "noise": args.noise,
        "seed": args.seed,
        "params": dict(args.param) or None,
    }
    inputs = read_inputs(args.inputs)
    if args.dry_run:
        params = options.pop("params") or {}
        return print_estimate(args, make_client, "/saliency", inputs, {**options, **params})
    with make_client(args) as client:
        if out is not None and out.suffix == ".png":
            client.saliency_image(args.model, inputs, alpha=args.alpha, **options).save(out)
            return wrote(args, out, {})
        result = client.saliency(args.model, inputs, **options)
    if out is not None:
        tensors = {
            f"{i}:{part}": getattr(r, part) for i, r in enumerate(result.results) for part in ("attribution", "heatmap")
        }
        shapes = {k: {"shape": list(a.shape), "dtype": str(a.dtype)} for k, a in tensors.items()}
        results = [
            {"target": r.target, "label": r.label, "score": r.score, "probability": r.probability}
            | ({"convergence_delta": r.convergence_delta} if r.convergence_delta is not None else {})
            for r in result.results
        ]
        write_arrays(out, tensors, {"model": result.model, "method": result.method, "results": results})
        return wrote(args, out, shapes)
    if args.json:
        print_json(result)
        return 0
    rows = [
        [name, r.target, r.label, r.score, r.probability, r.convergence_delta, list(r.attribution.shape)]
        for name, r in zip(args.inputs, result.results, strict=True)
    ]
    print_table(["input", "target", "label", "score", "probability", "convergence delta", "attribution"], rows)
    return 0


def cmd_layers(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        layers = client.layers(args.model)
    if args.json:
        print_json(layers)
        return 0
    rows = [["  " * max(0, x.depth - 1) + (x.name or "(root)"), x.type, x.depth, x.num_parameters] for x in layers]
    print_table(["name", "type", "depth", "parameters"], rows)
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        found = client.nodes(args.model)
    if args.json:
        print_json(found)
        return 0
    rows = [[n.name, n.op, n.target, n.module_type, n.shape] for n in found.nodes]
    print_table(["node", "op", "target", "module type", f"shape at {found.input_size}"], rows)
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    size = [int(s) for s in args.input_size.split(",")] if args.input_size else None
    with make_client(args) as client:
        summary = client.summary(args.model, input_size=size, depth=args.depth)
    if args.json:
        print_json(summary)
    else:
        print(summary.text)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        if args.server_path:
            info = client.inspect_checkpoint(path=args.checkpoint, compare_to=args.compare_to, stats=args.stats)
        else:
            info = client.inspect_checkpoint(Path(args.checkpoint), compare_to=args.compare_to, stats=args.stats)
    if args.json:
        print_json(info)
        return 0
    print(f"format: {info.format}")
    for key, sd in info.state_dicts.items():
        print(f"\nstate dict {key or '(the file itself)'}: {len(sd.entries)} tensors, {sd.total_numel} values")
        headers = ["key", "shape", "dtype", "numel"] + (
            ["min", "max", "mean", "std", "nan", "inf"] if args.stats else []
        )
        rows = [
            [e.key, e.shape, e.dtype, e.numel]
            + ([e.min, e.max, e.mean, e.std, e.nan_count, e.inf_count] if args.stats else [])
            for e in sd.entries
        ]
        print_table(headers, rows)
    for key, opt in info.optimizers.items():
        kind = opt.type or "type not recorded"
        print(f"\noptimizer {key}: {kind}, {len(opt.param_groups)} parameter group(s), state for {len(opt.state)}")
    if info.other:
        print()
        print_table(["other", "value"], [[k, v] for k, v in info.other.items()])
    if info.compare is not None:
        print(f"\ncompared with {args.compare_to}:")
        for kind in ("missing_keys", "unexpected_keys", "shape_mismatches"):
            items = info.compare.get(kind) or []
            print(f"  {kind.replace('_', ' ')}: {len(items)}" + (f" {items}" if items else ""))
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    with open(args.spec, "rb") as f:
        entries = tomllib.load(f).get("models", [])
    if not isinstance(entries, list) or not entries:
        usage_error(f"{args.spec} has no [[models]] entries")
    infos = []
    with make_client(args) as client:
        for entry in entries:
            info = client.load_model(entry)
            infos.append(client.wait_for_model(info.name, timeout=args.wait) if args.wait else info)
    if args.json:
        print_json([i.to_json() for i in infos])
    else:
        print_table(["name", "status", "device", "weights"], [[i.name, i.status, i.device, i.weights] for i in infos])
    return 0


def cmd_unload(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        info = client.unload_model(args.name)
    if args.json:
        print_json(info.to_json())
    else:
        print(f"unloaded {info.name}")
    return 0


# ---- parsers ----------------------------------------------------------------------------------


def model_and_inputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a model name (`hookserve models` lists them)")
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="image files, or .npy preprocessed samples")


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parent = client_options()

    def command(name: str, handler: Handler, text: str) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, parents=[parent], help=text, description=text)
        parser.set_defaults(handler=handler)
        return parser

    p = command("models", cmd_models, "list the server's models, or one model's INFO and repr")
    p.add_argument("name", nargs="?", help="one model (default: list every model)")

    p = command("predict", cmd_predict, "class predictions for images (or .npy sample tensors)")
    model_and_inputs(p)
    p.add_argument("-k", "--top-k", type=int, default=5, help="classes per input")
    p.add_argument("--logits", action="store_true", help="include every logit (with --json)")
    add_dry_run(p)

    p = command("activations", cmd_activations, "what layers received and returned: stats, or -o to a file")
    model_and_inputs(p)
    p.add_argument(
        "-l",
        "--layers",
        action="append",
        required=True,
        help="module paths, patterns (layer4.*) or graph nodes (`hookserve nodes`), comma-separated",
    )
    p.add_argument("--capture", choices=["output", "input", "both"], default="output", help="which side of a layer")
    p.add_argument(
        "--reduce", choices=["mean", "max", "flatten"], default=None, help="reduce each map over its spatial dims"
    )
    p.add_argument("-o", "--output", type=Path, help="write .safetensors or .npz (every tensor) or .png (a grid)")
    p.add_argument("--channels", type=int, default=64, help=".png: at most this many channels")
    p.add_argument(
        "--tokens",
        type=token_choice,
        help="a vision transformer's tokens to keep: indices (0,3), patches or prefix",
    )
    add_dry_run(p)

    p = command("saliency", cmd_saliency, "attribution maps (Captum): a table, or -o to .png or arrays")
    model_and_inputs(p)
    p.add_argument(
        "-m",
        "--method",
        default="gradient",
        help="gradient, input_x_gradient, smoothgrad, integrated_gradients, gradcam, occlusion, ... (a wrong name "
        "is answered with every method the server has; each method's parameters are in the server's /docs)",
    )
    p.add_argument("-t", "--target", help="class index or label, or one per input comma-separated; default top-1")
    p.add_argument("--layer", help="gradcam: the layer (default: the last Conv2d)")
    p.add_argument("--steps", type=int, help="integrated_gradients (server default 50)")
    p.add_argument("--samples", type=int, help="smoothgrad (server default 25)")
    p.add_argument("--noise", type=float, help="smoothgrad (server default 0.15)")
    p.add_argument("--seed", type=int, help="smoothgrad (server default 0)")
    p.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        type=param_item,
        metavar="KEY=VALUE",
        help="another parameter of the method, VALUE as JSON (e.g. -m occlusion -p window=[8,8] -p strides=[4,4])",
    )
    p.add_argument("--alpha", type=float, default=0.5, help=".png: heatmap opacity")
    p.add_argument("-o", "--output", type=Path, help="write .png (heatmap over the input) or .safetensors / .npz")
    add_dry_run(p)

    p = command("layers", cmd_layers, "every named submodule")
    p.add_argument("model", help="a model name")

    p = command("nodes", cmd_nodes, "the graph nodes (torch.fx) /activations can capture beside module paths")
    p.add_argument("model", help="a model name")

    p = command("summary", cmd_summary, "torchinfo summary")
    p.add_argument("model", help="a model name")
    p.add_argument("--input-size", help="with the batch dim, e.g. 1,3,224,224 (default: 1 + the model's)")
    p.add_argument("--depth", type=int, default=3, help="nesting shown")

    p = command("inspect", cmd_inspect, "what a checkpoint holds (uploaded; no pickle runs)")
    p.add_argument("checkpoint", help="a local file (uploaded), or with --server-path a path on the server")
    p.add_argument("--compare-to", metavar="MODEL", help="report missing/unexpected keys and shape mismatches")
    p.add_argument("--stats", action="store_true", help="finite statistics of every tensor")
    p.add_argument("--server-path", action="store_true", help="CHECKPOINT is a path under the server's model dir")

    p = command("load", cmd_load, "load the [[models]] entries of a TOML file at run time (admin token)")
    p.add_argument("spec", type=Path, metavar="SPEC.toml", help="a TOML file of [[models]] entries, as --config takes")
    wait = "wait until each model is ready, at most this long (0: return at once)"
    p.add_argument("--wait", type=float, default=300.0, metavar="SECONDS", help=wait)
    p.add_argument("--no-wait", dest="wait", action="store_const", const=0.0, help="return while the models load")

    p = command("unload", cmd_unload, "unload a model and release its memory (admin token)")
    p.add_argument("name", help="a model name")
