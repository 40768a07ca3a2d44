"""In-process baselines: what torch alone does with the same model, input and preprocessing.

`forward` runs the model on a fixed tensor; `e2e` decodes the JPEG with PIL, preprocesses it
with the service's own `preprocess_image`, stacks, runs the model and takes softmax top-5.
`limit` runs two single-thread forward-only processes side by side: this machine's ceiling
for the model when every core works on it. `channels_last` runs the same rows with NHWC
weights and inputs, as the service runs convolutional models (memory_format "auto").
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch
import torchvision
from PIL import Image
from torch import nn

from bench.machine import CpuMeter, run_side_by_side
from bench.stats import latency_summary
from service.codecs.preprocess import preprocess_image
from service.specs.model import PreprocessSpec

RESNET_SPEC = PreprocessSpec()  # resnet18's default: resize 256, center crop 224, bilinear, ImageNet mean/std


@dataclass
class RawResult:
    """One in-process point; latency is per batch."""

    name: str
    mode: str
    batch: int
    threads: int
    iters: int
    wall_s: float
    images_per_s: float
    lat_ms: dict[str, float]
    cores: float
    other_cores: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_model(
    arch: str = "resnet18", device: str = "cpu", dtype: torch.dtype = torch.float32, channels_last: bool = False
) -> nn.Module:
    """A torchvision model with seeded random weights, in eval mode on `device` and `dtype` (NHWC if asked)."""
    torch.manual_seed(0)
    if arch == "lenet":
        from service.zoo.lenet import LeNet

        model: nn.Module = LeNet()
    else:
        model = torchvision.models.get_model(arch, weights=None)
    model = model.eval().to(device=device, dtype=dtype)
    return model.to(memory_format=torch.channels_last) if channels_last else model


def _layout(x: torch.Tensor, model: nn.Module) -> torch.Tensor:
    """The input in the model's memory format (NHWC when its first 4-D weight is)."""
    weight = next((p for p in model.parameters() if p.ndim == 4), None)
    if weight is not None and weight.is_contiguous(memory_format=torch.channels_last) and x.ndim == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x


def timed(
    name: str, fn: Callable[[], object], *, mode: str, batch: int, warmup: int, max_iters: int, max_seconds: float
) -> RawResult:
    """Run `fn` `warmup` times, then time it until `max_iters` or `max_seconds`."""
    for _ in range(warmup):
        fn()
    lat: list[float] = []
    meter = CpuMeter()
    meter.start()
    deadline = time.perf_counter() + max_seconds
    while len(lat) < max_iters and time.perf_counter() < deadline:
        t0 = time.perf_counter()
        fn()
        lat.append((time.perf_counter() - t0) * 1000.0)
    cpu = meter.stop()
    return RawResult(
        name=name,
        mode=mode,
        batch=batch,
        threads=torch.get_num_threads(),
        iters=len(lat),
        wall_s=cpu.wall_s,
        images_per_s=len(lat) * batch / cpu.wall_s,
        lat_ms=latency_summary(lat),
        cores=cpu.self_cores,
        other_cores=cpu.other_cores,
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_fn(model: nn.Module, batch: int, input_size: tuple[int, ...] = (3, 224, 224)) -> Callable[[], object]:
    """Forward only, on a fixed seeded tensor already on the model's device."""
    param = next(model.parameters())
    x = torch.randn((batch, *input_size), generator=torch.Generator().manual_seed(0))
    x = _layout(x.to(device=param.device, dtype=param.dtype), model)

    def fn() -> object:
        with torch.inference_mode():
            out = model(x)
        _sync(param.device)
        return out

    return fn


def decode(jpeg: bytes, spec: PreprocessSpec = RESNET_SPEC) -> torch.Tensor:
    """PIL decode + the service's preprocessing: [3, 224, 224] float32."""
    image = Image.open(io.BytesIO(jpeg))
    image.load()
    return preprocess_image(image, spec, 3)


def e2e_fn(model: nn.Module, jpeg: bytes, batch: int, pool: ThreadPoolExecutor | None = None) -> Callable[[], object]:
    """Decode + our preprocessing + stack + forward + softmax top-5, as the server does per request.

    With `pool`, the images of a batch are decoded on its threads (PIL releases the GIL).
    """
    param = next(model.parameters())

    def fn() -> object:
        samples = list(pool.map(decode, [jpeg] * batch)) if pool else [decode(jpeg) for _ in range(batch)]
        with torch.inference_mode():
            x = _layout(torch.stack(samples).to(device=param.device, dtype=param.dtype, non_blocking=True), model)
            probs = torch.softmax(model(x).float(), dim=1)
            top = torch.topk(probs, 5, dim=1)
            return top.values.tolist(), top.indices.tolist()

    return fn


def run_raw(
    arch: str,
    mode: str,
    *,
    batch: int,
    threads: int,
    jpeg: bytes,
    seconds: float,
    warmup: int = 3,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    decode_threads: int = 1,
    on_thread: bool = False,
    channels_last: bool = False,
) -> RawResult:
    """One in-process point with `threads` intra-op threads (and the model on `device` in `dtype`).

    `on_thread`: run it on a new thread that sets its own thread count, as the service's executor does.
    """
    if on_thread:
        box: list[RawResult] = []
        job = partial(
            run_raw,
            arch,
            mode,
            batch=batch,
            threads=threads,
            jpeg=jpeg,
            seconds=seconds,
            warmup=warmup,
            channels_last=channels_last,
        )
        worker = threading.Thread(target=lambda: box.append(job()), name="raw-executor")
        worker.start()
        worker.join()
        if not box:
            raise RuntimeError("the raw worker thread failed (see its traceback above)")
        box[0].name += ", on a worker thread"
        return box[0]
    torch.set_num_threads(threads)
    model = build_model(arch, device, dtype, channels_last)
    size = (3, 32, 32) if arch == "lenet" else (3, 224, 224)
    label = "decode+preprocess+forward" if mode == "e2e" else "forward only"
    if device == "cpu":
        where = f"{threads} thread{'s' if threads > 1 else ''}"
    else:
        where = f"{device} {str(dtype).removeprefix('torch.')}, decode on {decode_threads} threads"
    name = f"raw {arch} {label}, batch {batch}, {where}{', channels_last' if channels_last else ''}"
    with ThreadPoolExecutor(decode_threads) as pool:
        fn = (
            forward_fn(model, batch, size)
            if mode == "forward"
            else e2e_fn(model, jpeg, batch, pool if decode_threads > 1 else None)
        )
        return timed(name, fn, mode=mode, batch=batch, warmup=warmup, max_iters=100_000, max_seconds=seconds)


def _limit_worker(arch: str, batch: int, seconds: float, channels_last: bool, *, barrier: Any, out: Any) -> None:
    torch.set_num_threads(1)
    model = build_model(arch, channels_last=channels_last)
    fn = forward_fn(model, batch)
    for _ in range(2):
        fn()
    barrier.wait()
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    n = 0
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    out.put((n * batch, time.perf_counter() - t0, time.process_time() - cpu0))


def run_limit(
    arch: str = "resnet18", batch: int = 8, seconds: float = 10.0, processes: int = 2, channels_last: bool = False
) -> RawResult:
    """`processes` single-thread forward-only processes side by side; images/s is their sum."""
    parts, cpu = run_side_by_side(
        _limit_worker,
        [((arch, batch, seconds, channels_last), {}) for _ in range(processes)],
        watch=None,
        start_timeout=300,
        result_timeout=seconds + 300,
    )
    rate = sum(images / wall for images, wall, _ in parts)
    workers = sum(c for _, _, c in parts) / max(w for _, w, _ in parts)
    return RawResult(
        name=f"raw {arch} forward only, {processes} single-thread processes side by side, batch {batch}"
        + (", channels_last" if channels_last else ""),
        mode="limit",
        batch=batch,
        threads=1,
        iters=sum(images for images, _, _ in parts) // batch,
        wall_s=max(w for _, w, _ in parts),
        images_per_s=rate,
        lat_ms=latency_summary([wall * 1000.0 * batch / images for images, wall, _ in parts]),
        cores=workers,
        other_cores=max(0.0, cpu.machine_cores - workers),
    )
