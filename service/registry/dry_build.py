"""A model's load rehearsed on the meta device: what loading would refuse, found without memory or compute.

`hookserve check` runs this for every entry that passed the cheap checks (schema, files, libraries):
the architecture is built with its kwargs (a misspelt builder argument fails here), the weights
file's keys and shapes are matched against it (read without their values), and a forward on
zeros of `[1, *input_size]` runs (a wrong `input_size` fails here). Meta tensors have shapes and
dtypes but no data, so a resnet50 costs what its Python code costs, not its 100 MB. A model whose
forward needs real values (`.item()`, data-dependent control flow) cannot be rehearsed that far:
the forward is skipped for it, never reported as a problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from service.errors import HookserveError, ModelLoadError, first_line
from service.registry.paths import resolve_under
from service.registry.preprocess_defaults import resolve_preprocess
from service.registry.sources import build_module
from service.registry.weights import WeightsFile, split_checkpoint
from service.specs.model import ModelSpec, Source

META_LIMITS = ("meta", "item()", "data-dependent", "NotImplementedError")


def rehearse(spec: ModelSpec, model_dir: Path) -> list[tuple[str, str]]:
    """(field, message) for each thing loading `spec` would refuse; [] when the rehearsal found nothing.
    A TorchScript program is not rehearsed (it cannot be loaded onto the meta device)."""
    if spec.source is Source.torchscript:
        return []
    try:
        with torch.device("meta"):
            module = build_module(spec.model_copy(update={"weights": None}), model_dir, False)
    except ModelLoadError as exc:
        return [("architecture", str(exc))]
    except TypeError as exc:
        field = "kwargs" if "keyword argument" in str(exc) else "architecture"
        return [(field, f"building it fails: {first_line(exc)}")]
    except Exception as exc:  # a user's model code may raise anything while it is built
        return [("architecture", f"building it fails: {type(exc).__name__}: {first_line(exc)}")]
    problems: list[tuple[str, str]] = []
    if spec.weights is not None and spec.weights != "DEFAULT":
        weights_problem = _weights_problem(module, model_dir, spec.weights)
        if weights_problem is not None:
            problems.append(("weights", weights_problem))
    forward_problem = _forward_problem(spec, module)
    if forward_problem is not None:
        problems.append(("input_size", forward_problem))
    return problems


def _weights_problem(module: nn.Module, model_dir: Path, weights: str) -> str | None:
    """Why the weights file would not load into `module` (strictly, as loading does), read without its values."""
    try:
        found = _read_meta(resolve_under(model_dir, weights)).model_state
    except ModelLoadError as exc:
        return first_line(exc)
    except HookserveError as exc:
        return str(exc.detail)
    model = {key: list(t.shape) for key, t in module.state_dict().items()}
    held = {key: list(t.shape) for key, t in found.items()}
    missing = [k for k in model if k not in held]
    unexpected = [k for k in held if k not in model]
    mismatched = [
        f"{k} {held[k]} in the file, {model[k]} in the model" for k in model if k in held and held[k] != model[k]
    ]
    parts = [
        f"{len(items)} {what} ({', '.join(map(str, items[:3]))}{', ...' if len(items) > 3 else ''})"
        for what, items in (
            ("missing keys", missing),
            ("unexpected keys", unexpected),
            ("shape mismatches", mismatched),
        )
        if items
    ]
    return f"{weights} does not match the architecture: {'; '.join(parts)}" if parts else None


def _read_meta(path: Path) -> WeightsFile:
    """The file's state dict as meta tensors: names, shapes and dtypes, no values read."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        state: dict[str, torch.Tensor] = {}
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (a safe_open handle has no __iter__)
                piece = f.get_slice(key)
                state[key] = torch.empty(piece.get_shape(), dtype=_safetensors_dtype(piece.get_dtype()), device="meta")
        return WeightsFile(state, None)
    try:
        try:
            obj: Any = torch.load(path, map_location="meta", weights_only=True, mmap=True)
        except RuntimeError:  # a legacy (not zip) file cannot be memory-mapped
            obj = torch.load(path, map_location="meta", weights_only=True)
    except Exception as exc:
        raise ModelLoadError(
            f"{path.name} could not be read as a weights-only checkpoint ({type(exc).__name__}); "
            "files that need arbitrary code to unpickle are refused"
        ) from None
    return split_checkpoint(obj, path.name)


def _safetensors_dtype(name: str) -> torch.dtype:
    names = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32"}
    names |= {"I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
    dtype = getattr(torch, names.get(name, "float32"))
    assert isinstance(dtype, torch.dtype)
    return dtype


def _forward_problem(spec: ModelSpec, module: nn.Module) -> str | None:
    """Why a forward on zeros of `[1, *input_size]` fails, or None (also when meta tensors cannot tell)."""
    _, input_size = resolve_preprocess(spec, module)
    module.eval()
    try:
        with torch.no_grad():
            module(torch.zeros(1, *input_size, device="meta"))
    except (RuntimeError, ValueError, IndexError, TypeError, AssertionError, NotImplementedError) as exc:
        text = f"{type(exc).__name__}: {first_line(exc)}"
        if any(word in text for word in META_LIMITS):
            return None
        shape = f"[1, {', '.join(map(str, input_size))}]"
        fix = "fix input_size" if spec.input_size is not None else "set input_size in the model's config"
        return f"a forward on zeros of shape {shape} fails ({first_line(exc)}); {fix}"
    return None
