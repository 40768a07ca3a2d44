"""`hookserve features` beside raw in-process feature extraction, in one run (>= 0.8 x torch, >= 0.9 x ONNX Runtime).

The image set is the benchmark's cat JPEG (`skimage.data.chelsea()`, see `bench.workload`)
copied N times into a folder. Raw: read each file, decode with PIL, preprocess with the
service's `preprocess_image`, stack 8, run resnet18 with a forward hook on `layer4`, mean over
its spatial dims, copy out [8, 512] (2 torch threads, NCHW and channels_last). hookserve: the
`hookserve features` command (its own process, as a user runs it) against `python -m service`
in the default bench config, `-c 4 -b 8`, into safetensors shards; images/s is the command's
own measure of its extraction (start-up and imports excluded), the wall time is kept too. A third
raw row runs the same pipeline on ONNX Runtime (the graph up to the layer with the mean inside,
exported once): the engine the server's capture plans use, which the command should reach 0.9 x of.

    python -m bench.features --images 256          # alone; `python -m bench.run` runs it after the configs
    python -m bench.features --into bench/RESULTS.json   # then: python -m bench.report
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import nn
from torchvision.models.feature_extraction import create_feature_extractor

from bench.configs import DEFAULT
from bench.features_report import TARGET, TARGET_ORT, section
from bench.machine import CpuMeter, wait_idle
from bench.raw_torch import RESNET_SPEC, _layout, build_model
from bench.server import REPO, Server, free_port
from bench.workload import make_jpeg
from service.codecs.preprocess import preprocess_image
from service.registry.onnx_path import INPUT, OUTPUT, export, inference_session

MODEL = "resnet18"
LAYER = "layer4"
CROP = RESNET_SPEC.crop or 224  # the exported graph's input side
REDUCE = "mean"
BATCH = 8
PIPELINE = f"read+decode+preprocess+forward, batch {BATCH}"
CONCURRENCY = 4
Log = Callable[[str], None]


def copy_images(directory: Path, jpeg: bytes, count: int) -> list[Path]:
    """The cat JPEG as `cat_00000.jpg` ... in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"cat_{i:05d}.jpg" for i in range(count)]
    for path in paths:
        path.write_bytes(jpeg)
    return paths


def raw_features(paths: Sequence[Path], *, threads: int = 2, channels_last: bool = False) -> dict[str, Any]:
    """Read + decode + preprocess + forward with a hook on LAYER + mean, batches of BATCH, in this process."""
    torch.set_num_threads(threads)
    model = build_model(MODEL, channels_last=channels_last)
    captured: list[torch.Tensor] = []
    module = dict(model.named_modules())[LAYER]
    handle = module.register_forward_hook(lambda _m, _i, out: captured.append(out.mean(dim=(2, 3)).clone()))

    def forward(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            model(_layout(x, model))
        return captured.pop()

    try:
        point = _timed(paths, forward)
    finally:
        handle.remove()
    layout = ", channels_last" if channels_last else ""
    return {"name": f"raw {MODEL} {LAYER} features ({REDUCE}), {PIPELINE}, {threads} threads{layout}", **point}


class _Reduced(nn.Module):
    """The model up to LAYER, averaged over its spatial dims: one [N, C] output, as the ONNX Runtime row exports it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.body = create_feature_extractor(model, {LAYER: "features"})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features: torch.Tensor = self.body(x)["features"]
        return features.mean(dim=(2, 3))


def raw_onnxruntime_features(paths: Sequence[Path], *, threads: int = 2) -> dict[str, Any]:
    """As `raw_features`, the forward on ONNX Runtime: the graph up to LAYER with the mean inside it, exported once
    (batch axis dynamic) and run by one session of `threads` intra-op threads."""
    torch.set_num_threads(threads)
    reduced = _Reduced(build_model(MODEL)).eval()
    session = inference_session(export(reduced, torch.zeros(BATCH, 3, CROP, CROP)), threads)

    def forward(x: torch.Tensor) -> torch.Tensor:
        (features,) = session.run([OUTPUT], {INPUT: x.numpy()})
        return torch.from_numpy(features)

    point = _timed(paths, forward)
    return {"name": f"raw {MODEL} {LAYER} features ({REDUCE}) on ONNX Runtime, {PIPELINE}, {threads} threads", **point}


def _timed(paths: Sequence[Path], forward: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, Any]:
    """Images/s of reading, decoding and preprocessing each file and `forward` on batches of BATCH (one warm-up)."""

    def extract(batch: Sequence[Path]) -> torch.Tensor:
        samples = []
        for path in batch:
            image = Image.open(path)
            image.load()
            samples.append(preprocess_image(image, RESNET_SPEC, 3))
        return forward(torch.stack(samples))

    extract(paths[:BATCH])  # warm-up: oneDNN and ONNX Runtime settle their kernels on the first call
    meter = CpuMeter()
    meter.start()
    started = time.perf_counter()
    rows = sum(len(extract(paths[i : i + BATCH])) for i in range(0, len(paths), BATCH))
    seconds = time.perf_counter() - started
    cpu = meter.stop()
    return {
        "images": rows,
        "seconds": seconds,
        "images_per_s": rows / seconds,
        "cores": cpu.self_cores,
        "other_cores": cpu.other_cores,
    }


def hookserve_features(url: str, source: Path, out: Path, *, concurrency: int, batch: int) -> dict[str, Any]:
    """`hookserve features` as a subprocess; its JSON report plus the wall time of the whole command."""
    command = [sys.executable, "-m", "service.cli", "features", MODEL, str(source), "-l", LAYER, "--reduce", REDUCE]
    command += ["-o", str(out), "-c", str(concurrency), "-b", str(batch), "--json", "--url", url]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"hookserve features failed ({done.returncode}):\n{done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    report["wall_s"] = wall
    return report


def measure(
    images: int, workdir: Path, *, port: int = 0, idle_wait_s: float = 120.0, log: Log = print
) -> dict[str, Any]:
    """The raw rows, then the command against a fresh server; the ratios and the verdict."""
    paths = copy_images(workdir / "cats", make_jpeg(), images)
    raw = {}
    extractions: dict[str, Callable[[], dict[str, Any]]] = {
        "raw": lambda: raw_features(paths),
        "raw-cl": lambda: raw_features(paths, channels_last=True),
        "raw-ort": lambda: raw_onnxruntime_features(paths),
    }
    for key, extraction in extractions.items():
        wait_idle(idle_wait_s, log=log)
        raw[key] = extraction()
        log(f"{raw[key]['name']}: {raw[key]['images_per_s']:.1f} images/s")
    cfg = DEFAULT.config
    with Server(cfg, port or free_port(), workdir / "server") as server:
        warm = copy_images(workdir / "warm", make_jpeg(), 2 * CONCURRENCY * BATCH)
        hookserve_features(server.url, warm[0].parent, workdir / "warm-out", concurrency=CONCURRENCY, batch=BATCH)
        wait_idle(idle_wait_s, log=log)
        meter = CpuMeter([server.pid])
        meter.start()
        report = hookserve_features(
            server.url, paths[0].parent, workdir / "features-out", concurrency=CONCURRENCY, batch=BATCH
        )
        cpu = meter.stop()
        server_cores = cpu.watched_cores.get(server.pid, float("nan"))
    if report["extracted"] != images or report["failed"]:
        raise RuntimeError(f"the extraction is incomplete: {report}")
    ips = float(report["images_per_s"])
    log(
        f"hookserve features ({cfg.name} config, -c {CONCURRENCY} -b {BATCH}): {ips:.1f} images/s "
        f"({images / report['wall_s']:.1f} counting the command's start-up), "
        f"x raw {ips / raw['raw']['images_per_s']:.2f}, x raw channels_last {ips / raw['raw-cl']['images_per_s']:.2f}, "
        f"x raw ONNX Runtime {ips / raw['raw-ort']['images_per_s']:.2f}"
    )
    return {
        "images": images,
        "model": MODEL,
        "layer": LAYER,
        "reduce": REDUCE,
        "config": cfg.name,
        "concurrency": CONCURRENCY,
        "batch": BATCH,
        "raw": raw,
        "hookserve": {
            "images_per_s": ips,
            "wall_images_per_s": images / report["wall_s"],
            "seconds": report["seconds"],
            "server_cores": server_cores,
            "other_cores": cpu.other_cores,
        },
        "ratio": ips / raw["raw"]["images_per_s"],
        "ratio_cl": ips / raw["raw-cl"]["images_per_s"],
        "ratio_ort": ips / raw["raw-ort"]["images_per_s"],
        "target": TARGET,
        "target_ort": TARGET_ORT,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.features", description=__doc__)
    parser.add_argument("--images", type=int, default=256, help="copies of the cat JPEG (default 256)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--idle-wait", type=float, default=120.0)
    parser.add_argument("--into", type=Path, default=None, help="add the point to this RESULTS.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hookserve-bench-features-") as tmp:
        point = measure(args.images, Path(tmp), port=args.port, idle_wait_s=args.idle_wait)
    if args.into is not None:
        results = json.loads(args.into.read_text())
        results["features"] = point
        args.into.write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(section({"features": point})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
