"""Data-set jobs against a raw in-process loop, and what a running job costs interactive requests.

1. **Throughput.** A `unit_stats` job (every unit's mean, std, max, fraction positive and histogram)
   and an `exemplars` job (top 9 per unit) over a whole data set, timed from POST /jobs to
   `succeeded`, against the same work done in this process by hand: decode, preprocess, batch 8,
   a forward with hooks on the same layers, the same streaming reductions. Two workloads: LeNet over
   scikit-learn's 1797 digits (conv1, conv2, fc1), and resnet18 over a folder of JPEGs cut from
   scikit-image's pictures (layer3, layer4). The loop's time is its faster over one thread and
   every core.
   Rounds alternate server and loop (ABBA); the row is the median of the per-round ratios
   loop time / job time (1.0: the server's job is as fast as the loop; target 0.8).
2. **Interactive latency under a job.** LeNet `/predict` (the shipped sample PNG) p50 at 1 client
   while an exemplars job runs over the digits (restarted whenever it ends), against the same with no
   job, in ABBA windows; target: at most 1.5 x.

    .venv/bin/python -m bench.jobs [--rounds 2] [--images 200]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from PIL import Image
from sklearn.datasets import load_digits
from torch import nn

from bench.machine import machine_info
from bench.server import Server, ServerConfig, free_port
from bench.workload import LENET_SAMPLE
from service.codecs.preprocess import preprocess_image
from service.introspection.unit_stats import Exemplars, UnitStats
from service.specs.model import PreprocessSpec
from service.zoo.lenet import lenet_preprocess_spec, load_lenet

TOKEN = "bench-jobs"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BATCH = 8
THROUGHPUT_TARGET = 0.8
LATENCY_TARGET = 1.5


def digit_image(values: np.ndarray) -> Image.Image:
    return Image.fromarray(np.clip(values * 16, 0, 255).astype(np.uint8))


def write_jpegs(folder: Path, count: int, seed: int = 0) -> list[Path]:
    """`count` JPEGs (quality 90) of random crops of scikit-image's colour pictures, in two class folders."""
    from skimage import data

    pictures = [data.chelsea(), data.astronaut(), data.coffee(), data.rocket()]
    rng = np.random.default_rng(seed)
    files = []
    for i in range(count):
        picture = pictures[i % len(pictures)]
        h, w = picture.shape[:2]
        side = int(rng.integers(min(h, w) // 2, min(h, w)))
        top, left = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
        crop = Image.fromarray(picture[top : top + side, left : left + side])
        path = folder / ("a" if i % 2 == 0 else "b") / f"{i:04d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        crop.save(path, format="JPEG", quality=90)
        files.append(path)
    return sorted(files, key=lambda p: (p.parent.name, p.name))


def hand_loop(
    model: nn.Module,
    images: Sequence[Callable[[], Image.Image]],
    spec: PreprocessSpec,
    layers: Sequence[str],
    kind: str,
) -> float:
    """Seconds for decode + preprocess + batch-8 hooked forwards + the job's reductions over every image."""
    modules = dict(model.named_modules())
    started = time.perf_counter()
    reductions: dict[str, Any] = {}
    captured: dict[str, torch.Tensor] = {}
    handles = [
        modules[name].register_forward_hook(lambda _m, _a, out, name=name: captured.__setitem__(name, out))
        for name in layers
    ]
    try:
        with torch.inference_mode():
            for start in range(0, len(images), BATCH):
                x = torch.stack([preprocess_image(load(), spec, 3) for load in images[start : start + BATCH]])
                model(x)
                indices = torch.arange(start, start + x.shape[0])
                for name in layers:
                    t = captured[name]
                    if kind == "unit_stats":
                        if name in reductions:
                            reductions[name].update(t)
                        else:
                            reductions[name] = UnitStats.first(t, 32)
                    else:
                        reductions.setdefault(name, Exemplars.empty(9, "max")).update(t, indices)
    finally:
        for handle in handles:
            handle.remove()
    return time.perf_counter() - started


def run_job(url: str, body: dict[str, Any], timeout: float = 1800.0) -> float:
    """Seconds from POST /jobs to the job's success."""
    with httpx.Client(timeout=60, trust_env=False) as client:
        started = time.perf_counter()
        answer = client.post(f"{url}/jobs", json=body, headers=AUTH)
        answer.raise_for_status()
        job = answer.json()["id"]
        while True:
            info = client.get(f"{url}/jobs/{job}", headers=AUTH).json()
            if info["state"] not in ("queued", "running"):
                break
            if time.perf_counter() - started > timeout:
                raise TimeoutError(f"job {job} still running")
            time.sleep(0.02)
        elapsed = time.perf_counter() - started
        if info["state"] != "succeeded":
            raise RuntimeError(f"job {job} ended {info['state']}: {info.get('error')}")
        client.delete(f"{url}/jobs/{job}", headers=AUTH)
    return elapsed


@dataclass(frozen=True)
class Workload:
    model: str
    dataset: str
    layers: list[str]
    module: nn.Module
    loaders: Sequence[Callable[[], Image.Image]]
    spec: PreprocessSpec


def strongest_loop(w: Workload, kind: str) -> float:
    """The loop's faster time over one intra-op thread and every core: the strongest baseline this machine gives
    (on a busy machine threads that spin-wait for each other can make the multi-threaded loop many times slower)."""
    times = []
    for threads in sorted({1, os.cpu_count() or 1}):
        torch.set_num_threads(threads)
        times.append(hand_loop(w.module, w.loaders, w.spec, w.layers, kind))
    return min(times)


def throughput_rows(url: str, data_dir: Path, rounds: int, images: int) -> list[dict[str, Any]]:
    digits = load_digits()
    lenet = load_lenet().eval()
    digit_loaders = [lambda v=v: digit_image(v) for v in digits.images]
    jpegs = write_jpegs(data_dir / "pictures", images)
    from torchvision.models import resnet18

    resnet = resnet18().eval()  # weights do not change the time
    info = httpx.get(f"{url}/models/resnet18", timeout=60).json()
    resnet_preprocess = PreprocessSpec.model_validate(info["preprocess"])
    jpeg_loaders = [lambda p=p: Image.open(io.BytesIO(p.read_bytes())) for p in jpegs]
    workloads = [
        Workload("lenet", "digits", ["conv1", "conv2", "fc1"], lenet, digit_loaders, lenet_preprocess_spec()),
        Workload("resnet18", "pictures", ["layer3", "layer4"], resnet, jpeg_loaders, resnet_preprocess),
    ]
    rows = []
    for w in workloads:
        for kind in ("unit_stats", "exemplars"):
            body: dict[str, Any] = {"kind": kind, "model": w.model, "dataset": w.dataset, "layers": w.layers}
            body["parameters"] = {"bins": 32} if kind == "unit_stats" else {"k": 9, "score": "max"}
            ratios, jobs, loops = [], [], []
            for r in range(rounds):
                order = ("job", "loop") if r % 2 == 0 else ("loop", "job")
                times = {}
                for side in order:
                    if side == "job":
                        times[side] = run_job(url, body)
                    else:
                        times[side] = strongest_loop(w, kind)
                jobs.append(times["job"])
                loops.append(times["loop"])
                ratios.append(times["loop"] / times["job"])
            rows.append(
                {
                    "row": f"{w.model} {kind} over {w.dataset} ({len(w.loaders)} images; {', '.join(w.layers)})",
                    "job_s": statistics.median(jobs),
                    "loop_s": statistics.median(loops),
                    "ratio": statistics.median(ratios),
                    "target": THROUGHPUT_TARGET,
                }
            )
            print(rows[-1], flush=True)
    return rows


def predict_p50(url: str, seconds: float) -> float:
    body = LENET_SAMPLE.read_bytes()
    times = []
    with httpx.Client(timeout=60, trust_env=False) as client:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            started = time.perf_counter()
            answer = client.post(
                f"{url}/predict", data={"model": "lenet"}, files={"image": ("d.png", body, "image/png")}
            )
            answer.raise_for_status()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def latency_row(url: str, rounds: int, window_s: float) -> dict[str, Any]:
    stop = threading.Event()
    body = {"kind": "exemplars", "model": "lenet", "dataset": "digits", "layers": ["conv1", "conv2", "fc1"]}

    def keep_a_job_running() -> None:
        while not stop.is_set():
            run_job(url, body)

    alone: list[float] = []
    during: list[float] = []
    for r in range(rounds):
        for side in ("alone", "job") if r % 2 == 0 else ("job", "alone"):
            if side == "alone":
                alone.append(predict_p50(url, window_s))
                continue
            stop.clear()
            runner = threading.Thread(target=keep_a_job_running, daemon=True)
            runner.start()
            time.sleep(1.0)  # the job is running
            during.append(predict_p50(url, window_s))
            stop.set()
            runner.join()
    alone_ms, during_ms = 1000 * statistics.median(alone), 1000 * statistics.median(during)
    row: dict[str, Any] = {
        "row": "lenet /predict p50 at 1 client while an exemplars job runs over the digits / without",
        "alone_ms": alone_ms,
        "during_ms": during_ms,
        "ratio": during_ms / alone_ms,
        "target": LATENCY_TARGET,
    }
    print(row, flush=True)
    return row


def markdown(rows: list[dict[str, Any]], latency: dict[str, Any]) -> str:
    lines = [
        f"Machine: {machine_info()}",
        "",
        "| row | server job (s) | in-process loop (s) | loop / job | target |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['row']} | {row['job_s']:.2f} | {row['loop_s']:.2f} | {row['ratio']:.2f} | >= {row['target']} |"
        )
    lines += [
        "",
        "| row | with the job (ms) | alone (ms) | ratio | target |",
        "|---|---:|---:|---:|---:|",
        f"| {latency['row']} | {latency['during_ms']:.1f} | {latency['alone_ms']:.1f} | {latency['ratio']:.2f} "
        f"| <= {latency['target']} |",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds per row")
    parser.add_argument("--images", type=int, default=200, help="JPEGs in the resnet18 folder")
    parser.add_argument("--window", type=float, default=8.0, help="seconds per latency window")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hookserve-bench-jobs-") as tmp:
        root = Path(tmp)
        data_dir = root / "data"
        data_dir.mkdir()
        config = ServerConfig(
            "jobs",
            "the built-in registry with jobs enabled",
            {
                "HOOKSERVE_ADMIN_TOKEN": TOKEN,
                "HOOKSERVE_DATA_DIR": str(data_dir),
                "HOOKSERVE_JOBS_DIR": str(root / "j"),
            },
        )
        with Server(config, free_port(), root / "server") as server:
            rows = throughput_rows(server.url, data_dir, args.rounds, args.images)
            latency = latency_row(server.url, args.rounds, args.window)
    print(markdown(rows, latency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
