"""Convolution weights packed once for oneDNN, so the eager model's forwards skip a reorder per call.

On the CPU, torch runs a float32 `conv2d` through oneDNN, which copies the weight into its
kernel's blocked layout on every call. At batch 1 those copies are about a quarter of resnet18's
forward (measured on the project's 2-core AVX2 CPU: 49 -> 38 ms per image at one thread, batch 1;
18 % at batch 2, 5-7 % at batch 8). Here every Conv2d weight of the model is put into that layout
once, at load, and a `conv2d` call on one of those weights runs oneDNN's convolution on the packed
copy instead: the same kernel on the same data, so the same numbers. The packs are kept only when
the model's outputs on seeded probe batches are bit-identical with and without them.

The module tree is never changed: hooks, `/layers`, summaries and state dicts see the model as it
is, and the packs take effect only inside `ConvPacks.active()`, on the thread that entered it (the
executor enters it around the forwards it runs on the eager module). A packed Conv2d routes its
convolution through the packs: its `_conv_forward` (the method `Conv2d.forward` calls with the input
and weight) is shadowed on the instance by one that asks the thread's active packs first and else
calls its class's own. That costs one thread-local read per convolution; the TorchFunctionMode this
replaced took a Python call for every torch function of the forward (~1 ms of resnet18's 20 at batch
1). A class that overrides `_conv_forward` keeps its own, and copies of the module (hook lanes) keep
the routing. A call is left to torch when it would record autograd (Grad-CAM's layers from its
target on, input gradients), when its input is not channels_last, or when its weight, padding or
dtype is not one that was packed; a weight changed in place (its version counter moves) is packed
again before use.
"""

from __future__ import annotations

import logging
import threading
import types
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from service.errors import first_line
from service.registry.probes import Placement, output_tensors

log = logging.getLogger("hookserve.loader")

Pair = tuple[int, int]
Geometry = tuple[Pair, Pair, Pair, int]  # stride, padding, dilation, groups
PROBE_BATCHES = (1, 3)
ONEDNN = torch._C._ConvBackend.Mkldnn  # type: ignore[attr-defined]  # (the stubs omit it)


@dataclass
class _Pack:
    weight: weakref.ref[Tensor]
    version: int
    data_ptr: int
    packed: Tensor


@dataclass(frozen=True)
class ConvCall:
    """One `conv2d` call's arguments, normalized."""

    input: Tensor
    weight: Tensor
    bias: Tensor | None
    geometry: Geometry


class ConvPacks:
    """The packed weights of one model's Conv2d layers (shared by its hook lanes, which share its weights)."""

    def __init__(self) -> None:
        self._packs: dict[tuple[int, Geometry], _Pack] = {}
        self._lock = threading.Lock()
        self.calls = 0  # conv2d calls served from a pack (read by the load-time check and tests)

    def __len__(self) -> int:
        return len(self._packs)

    def add(self, conv: nn.Conv2d) -> bool:
        """Pack `conv`'s weight for the geometry its forward calls `conv2d` with; False when it cannot be."""
        geometry = _module_geometry(conv)
        weight = conv.weight
        if geometry is None or not _packable(weight) or type(conv)._conv_forward is not nn.Conv2d._conv_forward:
            return False  # (a class with its own `_conv_forward` convolves its own way: it is never routed)
        key = (id(weight), geometry)
        if key not in self._packs:
            self._packs[key] = _pack(weight, geometry)
        _route(conv)
        return True

    def run(self, call: ConvCall) -> Tensor | None:
        """The convolution on the packed weight, or None when this call is torch's to run."""
        x, weight, bias = call.input, call.weight, call.bias
        pack = self._packs.get((id(weight), call.geometry))
        if pack is None or pack.weight() is not weight:
            return None
        if not (type(x) is Tensor and x.device.type == "cpu" and x.dim() == 4):
            return None
        if x.dtype != torch.float32 or not _packable(weight):  # moved, cast or made an inference tensor since
            return None
        if not x.is_contiguous(memory_format=torch.channels_last) or x.is_contiguous():
            return None  # NCHW (or 1x1 spatial) inputs: oneDNN would answer in another layout than torch
        if bias is not None and not (type(bias) in (Tensor, nn.Parameter) and bias.dtype == torch.float32):
            return None
        if torch.is_grad_enabled() and (
            x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
        ):
            return None
        stride, padding, dilation, groups = call.geometry
        if torch._C._select_conv_backend(x, weight, bias, stride, padding, dilation, False, [0, 0], groups) != ONEDNN:
            return None  # torch runs this shape on another kernel (small batch-1 inputs, for one): so must we
        if _changed(pack, weight):
            try:
                with self._lock:
                    pack = self._packs[(id(weight), call.geometry)] = _pack(weight, call.geometry)
            except RuntimeError:  # a weight oneDNN cannot pack any more: torch's
                return None
        try:
            out: Tensor = torch.ops.mkldnn._convolution_pointwise(
                x, pack.packed, bias, list(padding), list(stride), list(dilation), groups, "none", [], ""
            )
        except RuntimeError:  # torch's own call raises the error a user should see (or handles the case)
            return None
        self.calls += 1
        return out

    def cover(self, module: nn.Module, placement: Placement) -> str:
        """Pack `module`'s Conv2d weights too (it may share weights with modules packed before), kept only when
        its outputs on the probe batches are bit-identical with and without the packs: "" or why not (then
        nothing of `module` is kept). The probes' calls are not counted in `calls`."""
        packs, calls = dict(self._packs), self.calls
        why = self._cover(module, placement)
        if why:
            self._packs = packs
            _unroute(module)
        self.calls = calls
        return why

    def _cover(self, module: nn.Module, placement: Placement) -> str:
        try:
            with torch.inference_mode(False), torch.no_grad():
                packed = [self.add(m) for m in module.modules() if isinstance(m, nn.Conv2d)]
        except RuntimeError as exc:
            return f"oneDNN cannot pack its weights ({first_line(exc)})"
        if not any(packed):
            return "no Conv2d layer with a float32 weight and integer padding"
        calls = self.calls
        for batch in PROBE_BATCHES:
            x = placement.probe(batch)
            try:
                with torch.inference_mode():
                    want = output_tensors(module(x))
                    with self.active():
                        got = output_tensors(module(x))
            except (RuntimeError, ValueError, IndexError) as exc:
                return f"a forward on packed weights failed ({first_line(exc)})"
            if len(want) != len(got) or not all(torch.equal(w, g) for w, g in zip(want, got, strict=True)):
                return "its outputs on packed weights are not bit-identical to torch's"
        if self.calls == calls:
            return "no convolution ran on a packed weight"
        return ""

    @contextmanager
    def active(self) -> Iterator[None]:
        """Within: convolutions of packed Conv2d layers (on this thread) run on their packs."""
        before = getattr(_ACTIVE, "packs", None)
        _ACTIVE.packs = self
        try:
            yield
        finally:
            _ACTIVE.packs = before


_ACTIVE = threading.local()  # `packs`: the ConvPacks active on this thread, if any


def _route(conv: nn.Conv2d) -> None:
    """Shadow `conv._conv_forward` with `_packed_conv_forward` bound to it (once per module)."""
    if "_conv_forward" not in vars(conv):
        conv._conv_forward = types.MethodType(_packed_conv_forward, conv)  # type: ignore[method-assign]


def _unroute(module: nn.Module) -> None:
    """Take the routing off `module`'s Conv2d layers: a model whose packs were refused is left as it was."""
    for conv in module.modules():
        routed = vars(conv).get("_conv_forward")
        if isinstance(routed, types.MethodType) and routed.__func__ is _packed_conv_forward:
            del conv._conv_forward


def _packed_conv_forward(conv: nn.Conv2d, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """`Conv2d._conv_forward` on the thread's active packs when they hold this call, else torch's.

    A method bound to its module, so a deep copy of the module (a hook lane) is routed through its own copy."""
    packs: ConvPacks | None = getattr(_ACTIVE, "packs", None)
    if packs is not None and (geometry := _module_geometry(conv)) is not None:
        x = input
        if conv.padding_mode != "zeros":  # as Conv2d._conv_forward: pad, then convolve with padding 0
            x = F.pad(input, conv._reversed_padding_repeated_twice, mode=conv.padding_mode)
        out = packs.run(ConvCall(x, weight, bias, geometry))
        if out is not None:
            return out
    result: Tensor = nn.Conv2d._conv_forward(conv, input, weight, bias)
    return result


def packed_convolutions(module: nn.Module, placement: Placement) -> tuple[ConvPacks | None, str]:
    """Packs for every Conv2d of `module`, kept when its outputs on the probe batches stay bit-identical;
    or (None, why not)."""
    if placement.device.type != "cpu":
        return None, f"it runs on {placement.device.type}"
    if placement.dtype != torch.float32:
        return None, f"it runs in {str(placement.dtype).removeprefix('torch.')}"
    if not placement.nhwc:
        return None, "it runs in NCHW (contiguous) memory format"
    if not (torch._C._has_mkldnn and torch.backends.mkldnn.enabled):
        return None, "torch has no oneDNN here"
    packs = ConvPacks()
    why = packs.cover(module, placement)
    if why:
        return None, why
    log.info("hooked forwards: %d convolution weights packed for oneDNN", len(packs))
    return packs, ""


def _pack(weight: Tensor, geometry: Geometry) -> _Pack:
    stride, padding, dilation, groups = geometry
    with torch.inference_mode(False), torch.no_grad():
        packed = torch.ops.mkldnn._reorder_convolution_weight(
            weight.detach(), list(padding), list(stride), list(dilation), groups, None
        )
    return _Pack(weakref.ref(weight), weight._version, weight.data_ptr(), packed)


def _changed(pack: _Pack, weight: Tensor) -> bool:
    """Whether `weight` was written in place (version counter) or given other storage since it was packed."""
    return weight._version != pack.version or weight.data_ptr() != pack.data_ptr


def _packable(weight: Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 4
        and not weight.is_inference()
    )


def _module_geometry(conv: nn.Conv2d) -> Geometry | None:
    """The geometry `conv.forward` passes to `conv2d` (padding 0 after its own F.pad for non-zero modes)."""
    padding = _pair(conv.padding) if conv.padding_mode == "zeros" else (0, 0)
    stride, dilation = _pair(conv.stride), _pair(conv.dilation)
    if padding is None or stride is None or dilation is None:
        return None
    return stride, padding, dilation, conv.groups


def _pair(value: object) -> Pair | None:
    if type(value) is int:
        return value, value
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(type(v) is int for v in value):
        return value[0], value[1]
    return None  # "same" / "valid" padding, or anything else: left to torch
