"""Attribution maps through Captum, equal to calling Captum directly (see API.md /saliency).

Methods: Saliency (Simonyan et al. 2014, arXiv:1312.6034), Input×Gradient (Shrikumar et al.
2016, arXiv:1605.01713), SmoothGrad (Smilkov et al. 2017, arXiv:1706.03825), Integrated
Gradients (Sundararajan et al. 2017, arXiv:1703.01365), Grad-CAM (Selvaraju et al. 2017,
arXiv:1610.02391). This module only adds batching bounds, seeding, targets and heatmaps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum

import torch
import torch.nn.functional as F
from captum.attr import InputXGradient, IntegratedGradients, LayerGradCam, NoiseTunnel, Saliency
from torch import Tensor, nn

from service.errors import InvalidField
from service.introspection.gradients import find_layer
from service.introspection.layers import last_conv2d
from service.introspection.targets import class_scores, target_scores


class SaliencyMethod(StrEnum):
    """The attribution methods /saliency offers."""

    GRADIENT = "gradient"
    INPUT_X_GRADIENT = "input_x_gradient"
    SMOOTHGRAD = "smoothgrad"
    INTEGRATED_GRADIENTS = "integrated_gradients"
    GRADCAM = "gradcam"


@dataclass(frozen=True)
class SaliencyItem:
    """One input's attribution (its own shape, no batch dim) and its `[H, W]` heatmap in [0, 1]."""

    target: int
    score: float
    probability: float
    attribution: Tensor
    heatmap: Tensor
    convergence_delta: float | None = None


def compute_saliency(
    model: nn.Module,
    x: Tensor,
    method: SaliencyMethod | str,
    targets: Sequence[int],
    *,
    logits: Tensor | None = None,
    layer_name: str | None = None,
    steps: int = 50,
    samples: int = 25,
    noise: float = 0.15,
    seed: int = 0,
    ig_internal_batch_size: int = 64,
    smoothgrad_batch_size: int | None = None,
) -> list[SaliencyItem]:
    """Attribute `targets[i]` for each input row `x[i]` with `method`; returns one item per input.

    `ig_internal_batch_size` bounds how many examples one IG forward sees (inputs are
    chunked to it too); `smoothgrad_batch_size` (None = all samples at once) bounds the
    noisy copies per forward. SmoothGrad seeds the RNG with `seed` per input (the global
    RNG state is restored), so an input's map does not depend on the rest of the batch.
    `logits`: the model's output for `x` when the caller already has it (saves a forward).
    """
    method = _method(method)
    n = x.shape[0]
    _check(steps >= 1, f"steps must be at least 1, got {steps}")
    _check(samples >= 1, f"samples must be at least 1, got {samples}")
    _check(noise >= 0, f"noise must be non-negative, got {noise}")
    _check(ig_internal_batch_size >= 1, "the IG internal batch size must be at least 1")
    _check(len(targets) == n, f"{len(targets)} targets for {n} inputs")
    _check(x.is_floating_point(), f"saliency needs a floating-point input, got {x.dtype}")
    _check(smoothgrad_batch_size is None or smoothgrad_batch_size >= 1, "the SmoothGrad batch size must be at least 1")
    layer = _gradcam_layer(model, layer_name) if method is SaliencyMethod.GRADCAM else None
    with torch.inference_mode(False), torch.enable_grad():
        inputs = x.detach().clone().requires_grad_(True)
        if logits is None:
            with torch.no_grad():
                logits = model(inputs)
        logits = class_scores(logits)
        k = logits.shape[1]
        for t in targets:
            _check(0 <= t < k, f"target index {t} is out of range: the model has {k} classes [0, {k - 1}]")
        scores = target_scores(logits, targets).float().tolist()
        probabilities = target_scores(logits.float().softmax(dim=1), targets).tolist()
        target_list = [int(t) for t in targets]
        deltas: list[float | None] = [None] * n
        if method is SaliencyMethod.GRADIENT:
            attributions = Saliency(model).attribute(inputs, target=target_list, abs=True)
        elif method is SaliencyMethod.INPUT_X_GRADIENT:
            attributions = InputXGradient(model).attribute(inputs, target=target_list)
        elif method is SaliencyMethod.SMOOTHGRAD:
            attributions = _smoothgrad(
                model, inputs, target_list, samples=samples, noise=noise, seed=seed, batch_size=smoothgrad_batch_size
            )
        elif method is SaliencyMethod.INTEGRATED_GRADIENTS:
            attributions, delta = _integrated_gradients(model, inputs, target_list, steps, ig_internal_batch_size)
            deltas = [float(d) for d in delta.tolist()]
        else:
            attributions = LayerGradCam(model, layer).attribute(inputs, target=target_list, relu_attributions=True)
    if method is SaliencyMethod.GRADCAM:
        attributions = _gradcam_maps(attributions, layer_name, x)
    items = []
    for i in range(n):
        attribution = attributions[i].detach()
        if method is SaliencyMethod.GRADCAM:
            attribution = attribution[0]
            heatmap = F.interpolate(
                attributions[i : i + 1].float(), size=tuple(x.shape[-2:]), mode="bilinear", align_corners=False
            )[0, 0]
        else:
            heatmap = _input_space_map(attribution)
        items.append(
            SaliencyItem(target_list[i], scores[i], probabilities[i], attribution, _minmax(heatmap), deltas[i])
        )
    return items


def _smoothgrad(
    model: nn.Module,
    inputs: Tensor,
    targets: list[int],
    *,
    samples: int,
    noise: float,
    seed: int,
    batch_size: int | None,
) -> Tensor:
    """NoiseTunnel(Saliency) per input: its noise level `noise * (x.max() - x.min())` is per input.

    Captum's float32 noise would promote a half-precision input, so the noisy input is cast
    back to the input's dtype before the model sees it.
    """
    dtype = inputs.dtype

    def forward(x: Tensor) -> Tensor:
        out: Tensor = model(x if x.dtype == dtype else x.to(dtype))
        return out

    tunnel = NoiseTunnel(Saliency(forward))
    out = []
    for i, target in enumerate(targets):
        row = inputs[i : i + 1].detach()
        stdev = float(noise * (row.max() - row.min()))
        row.requires_grad_(True)
        with _seeded(seed, row.device):
            out.append(
                tunnel.attribute(
                    row,
                    nt_type="smoothgrad",
                    nt_samples=samples,
                    nt_samples_batch_size=batch_size,
                    stdevs=stdev,
                    target=target,
                )
            )
    return torch.cat(out)


def _integrated_gradients(
    model: nn.Module, inputs: Tensor, targets: list[int], steps: int, batch_size: int
) -> tuple[Tensor, Tensor]:
    """IG from a zero baseline, in input chunks of at most `batch_size` so no forward exceeds it."""
    ig = IntegratedGradients(model)
    attributions, deltas = [], []
    for start in range(0, inputs.shape[0], batch_size):
        chunk = inputs[start : start + batch_size].detach().requires_grad_(True)
        attr, delta = ig.attribute(
            chunk,
            baselines=0,
            target=targets[start : start + batch_size],
            n_steps=steps,
            internal_batch_size=batch_size,
            return_convergence_delta=True,
        )
        attributions.append(attr)
        deltas.append(delta)
    return torch.cat(attributions), torch.cat(deltas)


def _gradcam_layer(model: nn.Module, layer_name: str | None) -> nn.Module:
    """The named layer, or the last Conv2d when none is named."""
    if layer_name is None:
        layer_name = last_conv2d(model)
        if layer_name is None:
            raise InvalidField("gradcam needs a layer: this model has no Conv2d, so name one in `layer`")
    return find_layer(model, layer_name)


def _gradcam_maps(attributions: object, layer_name: str | None, x: Tensor) -> Tensor:
    """Check Grad-CAM gave `[N, 1, h, w]` maps (a spatial layer with one output), else InvalidField."""
    if isinstance(attributions, Tensor) and attributions.dim() == 4 and attributions.shape[1] == 1 and x.dim() >= 3:
        return attributions.detach()
    where = repr(layer_name) if layer_name is not None else "the default layer"
    got = f"maps of shape {list(attributions.shape)}" if isinstance(attributions, Tensor) else "several outputs"
    raise InvalidField(
        f"gradcam needs a layer with one spatial output [N, C, h, w] on an image input; {where} gives {got}"
    )


def _input_space_map(attribution: Tensor) -> Tensor:
    """Max over channels of |attribution| for `[C, H, W]`; `|a|` for `[H, W]`; `[1, L]` for `[L]`."""
    magnitude = attribution.float().abs()
    if magnitude.dim() >= 3:
        return magnitude.reshape(-1, *magnitude.shape[-2:]).amax(dim=0)
    if magnitude.dim() == 2:
        return magnitude
    return magnitude.reshape(1, -1)


def _minmax(heatmap: Tensor) -> Tensor:
    """Min-max scale to [0, 1] (non-finite values count as 0); all zeros when flat."""
    h = torch.nan_to_num(heatmap.detach().float(), nan=0.0, posinf=0.0, neginf=0.0)
    low, high = h.min(), h.max()
    if not bool(high > low):
        return torch.zeros_like(h)
    return ((h - low) / (high - low)).clamp_(0.0, 1.0)


@contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed the CPU and `device` generators with `seed`, restoring both states afterwards."""
    if device.type == "cpu":
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            yield
        return
    module = torch.get_device_module(device.type)
    index = device.index if device.index is not None else module.current_device()
    with torch.random.fork_rng(devices=[index], device_type=device.type):
        torch.default_generator.manual_seed(seed)
        if device.type == "cuda":
            torch.cuda.default_generators[index].manual_seed(seed)
        else:
            module.manual_seed(seed)
        yield


def _method(method: SaliencyMethod | str) -> SaliencyMethod:
    try:
        return SaliencyMethod(method)
    except ValueError:
        choices = ", ".join(m.value for m in SaliencyMethod)
        raise InvalidField(f"unknown saliency method {method!r}; choose one of {choices}") from None


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidField(message)
