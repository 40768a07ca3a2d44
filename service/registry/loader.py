"""Turn a ModelSpec into a LoadedModel: build, load weights, place, warm up."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from service.dtypes import BY_NAME
from service.errors import HookserveError, ModelLoadError, first_line, scrub_paths
from service.introspection.attention import attention_modules
from service.introspection.layers import module_names
from service.introspection.shape_propagation import ShapePropagation
from service.introspection.shapes import probe_shapes
from service.registry.devices import pick_device
from service.registry.fast_path import DEFAULT_PATHS, PathDefaults, PredictionPath, prediction_path
from service.registry.labels import read_labels
from service.registry.loaded import LoadedModel
from service.registry.optimizers import build_optimizer
from service.registry.packed_convolutions import ConvPacks, packed_convolutions
from service.registry.paths import resolve_under
from service.registry.preprocess_defaults import resolve_preprocess
from service.registry.probes import Placement
from service.registry.row_times import measure_row_times
from service.registry.sources import DEFAULT_WEIGHTS, build_module
from service.registry.weights import load_into, load_optimizer_state, read_weights
from service.specs.model import MemoryFormat, ModelSpec, Source

log = logging.getLogger("hookserve.loader")


def load_model(
    spec: ModelSpec,
    model_dir: Path,
    default_device: str,
    allow_downloads: bool,
    path_defaults: PathDefaults = DEFAULT_PATHS,
) -> LoadedModel:
    """Build and place one model. Raises ModelLoadError with a message fit for INFO `error`."""
    try:
        return _load(spec, model_dir, default_device, allow_downloads, path_defaults)
    except ModelLoadError as exc:
        raise ModelLoadError(scrub_paths(str(exc))) from None
    except HookserveError as exc:
        raise ModelLoadError(scrub_paths(str(exc.detail))) from None
    except Exception as exc:  # a failing user model must not take the server down
        message = str(exc).replace(str(model_dir.resolve()), "<model dir>")
        raise ModelLoadError(scrub_paths(f"{type(exc).__name__}: {message}")) from None  # no server paths in INFO


def _load(
    spec: ModelSpec, model_dir: Path, default_device: str, allow_downloads: bool, path_defaults: PathDefaults
) -> LoadedModel:
    device = pick_device(spec.device or default_device)
    dtype = BY_NAME[spec.dtype.value].torch
    module = build_module(spec, model_dir, allow_downloads)
    optimizer_state: dict[str, Any] | None = None
    if spec.source is Source.torchscript and spec.weights is None:
        weights_name = spec.architecture  # the program holds its weights
    elif spec.weights is None:
        weights_name = "random"
    elif spec.weights == DEFAULT_WEIGHTS:
        weights_name = DEFAULT_WEIGHTS
    else:
        weights_file = read_weights(resolve_under(model_dir, spec.weights))
        load_into(module, weights_file, spec.weights)
        optimizer_state = weights_file.optimizer_state
        weights_name = spec.weights
    module.eval()
    module.to(device=device, dtype=dtype)
    optimizer = build_optimizer(spec, module, needed=optimizer_state is not None)
    if optimizer is not None and optimizer_state is not None:
        load_optimizer_state(optimizer, optimizer_state, str(spec.weights))
    labels = read_labels(resolve_under(model_dir, spec.labels)) if spec.labels else None
    preprocess, input_size = resolve_preprocess(spec, module)
    try:
        num_classes, channels_last = warm_up_in_format(spec.memory_format, module, input_size, device, dtype)
    except (RuntimeError, ValueError, IndexError) as exc:
        if spec.input_size is not None or isinstance(exc, torch.OutOfMemoryError):
            raise
        reason = first_line(exc)
        raise ModelLoadError(
            f"warm-up forward on zeros of shape [1, {', '.join(map(str, input_size))}] failed ({reason}); "
            "set input_size in the model's config"
        ) from None
    if labels is not None and num_classes is not None and len(labels) != num_classes:
        raise ModelLoadError(f"labels file has {len(labels)} labels but the model outputs {num_classes} classes")
    placement = Placement(input_size, device, dtype, channels_last)
    shapes = probe_shapes(module, placement.probe(1), module)
    propagation = ShapePropagation(module, shapes)  # copied now, before any request can have hooks on the module
    row_times = measure_row_times(module, placement.probe(1))
    path = prediction_path(spec, module, placement, path_defaults)
    packs, packs_reason, predictions_packed = conv_packs(spec, module, path, placement, path_defaults)
    params = list(module.parameters())
    return LoadedModel(
        spec=spec,
        module=module,
        device=device,
        dtype=dtype,
        preprocess=preprocess,
        input_size=input_size,
        labels=labels,
        optimizer=optimizer,
        weights=weights_name,
        num_classes=num_classes,
        num_parameters=sum(p.numel() for p in params),
        trainable_parameters=sum(p.numel() for p in params if p.requires_grad),
        text=repr(module),
        layer_names=tuple(module_names(module)),
        layer_shapes=shapes,
        shape_propagation=propagation,
        row_times=row_times,
        fast=path.module,
        prediction_path=path.name,
        prediction_path_reason=path.reason,
        conv_packs=packs,
        conv_packs_reason=packs_reason,
        predictions_packed=predictions_packed,
        channels_last=channels_last,
        attention=attention_modules(module),
    )


def conv_packs(
    spec: ModelSpec, module: nn.Module, path: PredictionPath, placement: Placement, defaults: PathDefaults
) -> tuple[ConvPacks | None, str, bool]:
    """Packed convolution weights for forwards on the served module (and on a fused prediction copy when they
    hold for it too): (packs or None, why not, whether predictions use them)."""
    wanted = spec.packed_convolutions if spec.packed_convolutions is not None else defaults.packed_convolutions
    if not wanted:
        return None, "packed_convolutions = false", False
    packs, reason = packed_convolutions(module, placement)
    if packs is None:
        return None, reason, False
    if path.module is None:  # predictions run on the served module
        return packs, "", True
    if path.name != "fused":  # ONNX Runtime or a compiled module: no torch conv2d calls to serve
        return packs, "", False
    why = packs.cover(path.module, placement)
    if why:
        log.info("predictions on the fused copy keep torch's convolutions: %s", why)
    return packs, "", not why


def warm_up_in_format(
    memory_format: MemoryFormat, module: nn.Module, input_size: list[int], device: torch.device, dtype: torch.dtype
) -> tuple[int | None, bool]:
    """Put the module in its memory format and warm it up: (number of classes or None, channels_last).

    NHWC is only an optimization, so under `auto` a model that cannot run it (a `.view` after a
    convolution needs NCHW strides) goes back to NCHW instead of failing to load. Parameters keep
    their identity either way, so an optimizer built over them still holds them.
    """
    if use_channels_last(memory_format, module, input_size):
        module.to(memory_format=torch.channels_last)
        try:
            return warm_up(module, input_size, device, dtype, channels_last=True), True
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, ValueError, IndexError) as exc:
            if memory_format is not MemoryFormat.auto:
                raise
            log.info("model does not run channels_last (%s); it runs contiguous", first_line(exc))
            module.to(memory_format=torch.contiguous_format)
    return warm_up(module, input_size, device, dtype), False


def use_channels_last(memory_format: MemoryFormat, module: nn.Module, input_size: list[int]) -> bool:
    """NHWC for image models with convolutions unless the spec says otherwise.

    oneDNN on CPU and cuDNN on CUDA run NHWC convolutions without reordering each call:
    resnet18 on this project's 2-core CPU forwards a batch of 8 ~30 % faster, efficientvit_b0 ~20 %.
    """
    if memory_format is not MemoryFormat.auto:
        return memory_format is MemoryFormat.channels_last
    return len(input_size) == 3 and any(isinstance(m, nn.Conv2d) for m in module.modules())


def warm_up(
    module: nn.Module, input_size: list[int], device: torch.device, dtype: torch.dtype, channels_last: bool = False
) -> int | None:
    """One forward on zeros: proves the model runs and tells whether it outputs class scores."""
    x = torch.zeros((1, *input_size), device=device, dtype=dtype)
    if channels_last and x.ndim == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        out = module(x)
    if isinstance(out, torch.Tensor) and out.ndim == 2:
        return int(out.shape[1])
    return None
