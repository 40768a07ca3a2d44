"""A model's preprocessing and input size when its config leaves them out: the config, else timm's data config,
else the ImageNet defaults. Light to import (torch only), so `hookserve check` can use it."""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from service.specs.model import Interpolation, ModelSpec, PreprocessSpec, Source

IMAGENET_RESIZE, IMAGENET_CROP = 256, 224


def resolve_preprocess(spec: ModelSpec, module: nn.Module) -> tuple[PreprocessSpec, list[int]]:
    """Config first, else timm's data config, else the ImageNet defaults sized to `input_size`."""
    timm_cfg = _timm_data_config(module) if spec.source is Source.timm else None
    if spec.preprocess is not None:
        preprocess = spec.preprocess
    elif timm_cfg is not None:
        crop = int(timm_cfg["input_size"][-1])
        preprocess = PreprocessSpec(
            resize=math.floor(crop / float(timm_cfg.get("crop_pct", 0.875))),
            crop=crop,
            interpolation=Interpolation(timm_cfg.get("interpolation", "bilinear")),
            mean=[float(m) for m in timm_cfg["mean"]],
            std=[float(s) for s in timm_cfg["std"]],
        )
    elif spec.input_size is not None and len(spec.input_size) == 3 and spec.input_size[-1] != IMAGENET_CROP:
        crop = spec.input_size[-1]
        channels = spec.input_size[0]
        preprocess = PreprocessSpec(
            resize=round(crop * IMAGENET_RESIZE / IMAGENET_CROP),
            crop=crop,
            grayscale=channels == 1,
            **({"mean": [0.449], "std": [0.226]} if channels == 1 else {}),
        )
    else:
        preprocess = PreprocessSpec()
    if spec.input_size is not None:
        input_size = list(spec.input_size)
    elif timm_cfg is not None:
        input_size = [int(s) for s in timm_cfg["input_size"]]
    else:
        side = preprocess.crop or IMAGENET_CROP
        input_size = [3, side, side]
    return preprocess, input_size


def _timm_data_config(module: nn.Module) -> dict[str, Any] | None:
    from timm.data.config import resolve_data_config

    try:
        cfg: dict[str, Any] = resolve_data_config({}, model=module)  # type: ignore[no-untyped-call]
    except (AttributeError, KeyError, TypeError):
        return None
    return cfg
