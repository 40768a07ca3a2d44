"""The server settings the benchmark runs hookserve with, and which points each one measures."""

from __future__ import annotations

import os
from dataclasses import dataclass

from bench.server import ServerConfig
from bench.workload import INTROSPECTION_KINDS, JPEG_INTROSPECTION_KINDS, PREDICT_KINDS, Kind

CORES = os.cpu_count() or 1
LOAD = (1, 8, 32)
UNDER_LOAD = (8, 32)  # issue 12's introspection rows
BATCHING = {"HOOKSERVE_MAX_BATCH_SIZE": "8", "HOOKSERVE_MAX_BATCH_DELAY_MS": "5"}


@dataclass(frozen=True)
class Mix:
    """Several kinds at once against one server: `clients` closed-loop clients assigned to `kinds` round-robin."""

    name: str
    kinds: tuple[Kind, ...]
    clients: int
    seconds: float


@dataclass(frozen=True)
class Setup:
    """One server config, the (request kind, clients) points measured against it, and its mixed points."""

    config: ServerConfig
    points: tuple[tuple[Kind, int], ...]
    mixes: tuple[Mix, ...] = ()


# issue 12: half /predict, half /activations (one layer reduced), both JPEG uploads, 8 clients for 20 s
PREDICT_AND_ACTIVATIONS = Mix(
    "predict+activations", (Kind.PREDICT_JPEG_MULTIPART, Kind.ACTIVATIONS_L4_JPEG), clients=8, seconds=20.0
)
# issue 12: the points also measured against a server running today's main (see bench.baseline)
BASELINE_POINTS: tuple[tuple[Kind, int], ...] = ((Kind.PREDICT_JPEG_MULTIPART, 32), (Kind.ACTIVATIONS_L4_JPEG, 8))


def _threads(workers: int, per_job: int) -> dict[str, str]:
    return {
        "HOOKSERVE_WORKER_THREADS": str(workers),
        "HOOKSERVE_CPU_THREADS": str(CORES),
        "HOOKSERVE_TORCH_THREADS": str(per_job),
        "HOOKSERVE_DECODE_THREADS": str(CORES),
        **BATCHING,
    }


DEFAULT = Setup(
    ServerConfig(
        "default",
        f"the Settings defaults: {CORES} executor threads sharing {CORES} CPU threads, a job running alone takes up "
        f"to {CORES} intra-op threads and under load one each; {CORES} decode threads; batches of 8, 5 ms",
        _threads(CORES, CORES),
    ),
    (
        *((kind, c) for kind in PREDICT_KINDS for c in LOAD),
        (Kind.LENET_PREDICT, 1),
        *((kind, 1) for kind in INTROSPECTION_KINDS),
        *((kind, c) for kind in JPEG_INTROSPECTION_KINDS for c in UNDER_LOAD),
    ),
    (PREDICT_AND_ACTIVATIONS,),
)
ONE_THREAD = Setup(
    ServerConfig(
        "one-thread",
        f"{CORES} executor threads with 1 intra-op thread per job, always; {CORES} decode threads; batches of 8, 5 ms",
        _threads(CORES, 1),
    ),
    tuple((kind, c) for kind in (Kind.PREDICT_JPEG_MULTIPART, Kind.PREDICT_TENSOR) for c in LOAD),
)
ONE_EXECUTOR = Setup(
    ServerConfig(
        "one-executor",
        f"1 executor thread taking up to {CORES} intra-op threads; {CORES} decode threads; batches of 8, 5 ms",
        _threads(1, CORES),
    ),
    (
        (Kind.PREDICT_JPEG_MULTIPART, 1),
        (Kind.PREDICT_TENSOR, 1),
        (Kind.ACTIVATIONS_ALLCONV_ST, 1),
        (Kind.SALIENCY_GRADCAM, 1),
    ),
)
# the prediction path without ONNX Runtime: what issue 12's ratios would divide by on the torch path
TORCH_PATH = Setup(
    ServerConfig(
        "torch-path",
        "the default settings with HOOKSERVE_ONNXRUNTIME=false: predictions on the BatchNorm-folded torch copy",
        {**_threads(CORES, CORES), "HOOKSERVE_ONNXRUNTIME": "false"},
    ),
    ((Kind.PREDICT_TENSOR, 1), (Kind.PREDICT_JPEG_MULTIPART, 8), (Kind.PREDICT_JPEG_MULTIPART, 32)),
)
SETUPS: dict[str, Setup] = {s.config.name: s for s in (DEFAULT, TORCH_PATH, ONE_THREAD, ONE_EXECUTOR)}
