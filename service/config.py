"""Runtime settings: one pydantic-settings class, read from `HOOKSERVE_*` env and flags."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024


def _half_the_memory() -> int:
    """Half of this machine's physical memory (the default budget of requests in flight)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 16 * 1024 * MiB
    return max(1024 * MiB, total // 2)


def _off_is_none(value: Any) -> Any:
    return None if isinstance(value, str) and value.strip().lower() in ("off", "none", "") else value


OptionalPort = Annotated[Annotated[int, Field(ge=0, le=65535)] | None, BeforeValidator(_off_is_none)]  # 0: a free port


def _default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


class Settings(BaseSettings):
    """Everything configurable that is not a model. Env names are `HOOKSERVE_<FIELD>`."""

    model_config = SettingsConfigDict(env_prefix="HOOKSERVE_", extra="ignore")

    config: Path | None = Field(None, description="Models TOML; absent = the built-in registry.")
    model_dir: Path = Field(Path("models"), description="Root of every server-side path.")
    host: str = "127.0.0.1"
    port: int = 8000
    # the fronts beside HTTP, each on a port of its own; "off" (or null) serves none
    grpc_port: OptionalPort = Field(8001, description="KServe v2 / Triton gRPC (inference.GRPCInferenceService).")
    torchserve_management_port: OptionalPort = Field(8081, description="TorchServe-compatible management API.")
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N | mps")
    admin_token: str | None = Field(None, description="Bearer token for admin calls; unset = disabled.")
    allow_downloads: bool = Field(False, description='Allow weights = "DEFAULT" to download.')
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    cors_origins: list[str] = Field(default_factory=list, description="CORS allowed origins; empty = off.")

    # threads
    worker_threads: int = Field(default_factory=_default_threads, description="Executor threads per model.")
    cpu_threads: int = Field(
        default_factory=_default_threads, description="Intra-op threads all CPU jobs share (the cores)."
    )
    torch_threads: int = Field(
        default_factory=_default_threads,
        description="Most intra-op threads one job takes when it runs alone; under load each job takes one.",
    )
    decode_threads: int = Field(default_factory=_default_threads, description="Image decode pool size.")

    # batching (defaults; per model overridable in the TOML)
    max_batch_size: int = 8
    max_batch_delay_ms: float = 5.0
    max_queue: int = Field(256, description="Queued jobs per model before 503.")

    # prediction path (per model overridable in the TOML)
    onnxruntime: bool = Field(
        True,
        description="Plain predictions of float32 CPU models run on ONNX Runtime where it exports and agrees with "
        "the model (~12 % less CPU per image for resnet18 on a 2-core AVX2 CPU); false: the torch path.",
    )

    capture_plans: int = Field(
        4,
        ge=0,
        description="Capture sets per model (layers, capture side, sample shape) whose forward-only captures "
        "(/activations layers, /v2 layer outputs, data-set jobs) run on ONNX Runtime from a graph with the captured "
        "values as extra outputs, when the model's predictions do; least recently used dropped past it; 0: hooks only. "
        "Each plan holds ONNX Runtime's own copy of the weights (a resnet18 plan: ~200 MB of RSS).",
    )
    plan_after_requests: int = Field(
        3,
        ge=1,
        description="Batches of one capture set served by hooks before its capture plan is built (off the request "
        "path: hooks keep serving it until the plan is checked).",
    )

    packed_convolutions: bool = Field(
        True,
        description="Forwards on a float32 channels_last CPU model's own modules (hooked requests among them) run "
        "their convolutions on weights packed once for oneDNN where the outputs stay bit-identical (resnet18: "
        "~20 % less time per image at batch 1, ~5 % at batch 8; one more copy of the convolution weights).",
    )

    # limits
    max_body_bytes: int = 64 * MiB
    max_inputs: int = 64
    max_image_pixels: int = 40_000_000
    max_preprocessed_pixels: int = Field(
        40_000_000,
        ge=1,
        description="Most pixels any step of a model's preprocessing (resize, pad, crop) may make from one image, "
        "computed from the image's header before it is decoded: 413 over it. A 1x100000 PNG passes "
        "max_image_pixels, but resizing its shorter side to 256 would make 256x25600000 pixels. The default lets "
        "an image through whose sides are up to 610:1 apart for a model resizing to 256.",
    )
    max_layers: int = 256
    max_json_response_bytes: int = 64 * MiB
    max_binary_response_bytes: int = 1024 * MiB
    max_ig_steps: int = 512
    max_smoothgrad_samples: int = 256
    ig_internal_batch_size: int = Field(
        64,
        ge=1,
        description="Samples per forward/backward of integrated_gradients, layer_integrated_gradients and "
        "layer_conductance (memory bound).",
    )
    smoothgrad_batch_size: int = Field(32, ge=1, description="Noisy SmoothGrad samples per forward (memory bound).")
    chunk_seconds: float = Field(
        1.0,
        gt=0,
        description="Most seconds one forward (and backward) of a many-row method or sweep should take, from the "
        "model's time per row: its rows per forward are bounded by it, so a request given up on stops within "
        "about that long.",
    )
    max_request_memory_bytes: int = Field(
        2048 * MiB,
        description="Most memory one request may hold (inputs, forward, captures, graphs, answer), "
        "estimated from the layer shapes before any work: 413 over it.",
    )
    memory_budget_bytes: int = Field(
        default_factory=_half_the_memory,
        description="Memory all requests in flight may hold together; a request that does not fit waits "
        "(503 when max_queue already wait). Default: half the machine's memory.",
    )
    memory_trim_after_bytes: int = Field(
        256 * MiB,
        ge=0,
        description="Once finished requests' estimates, or the process's measured growth in resident memory, "
        "reach this much since the last trim and no request is in flight, the freed memory is given back to the OS "
        "(glibc malloc_trim); 0 = never.",
    )
    max_edits: int = Field(32, ge=1, description="Edits per /interventions request.")
    max_sources: int = Field(8, ge=0, description="Named donor runs per /interventions request.")
    max_edit_tensor_bytes: int = Field(16 * MiB, description="Size of one edit's tensor (add, set).")
    max_sweep_rows: int = Field(8192, ge=1, description="Channels x inputs one /interventions/sweep ablates.")
    max_occlusion_windows: int = Field(
        4096, description="Occlusion window positions per input (one perturbed row each)."
    )
    max_ablation_features: int = Field(
        1024, description="Feature-ablation groups per input (superpixels or grid cells; one perturbed row each)."
    )
    perturbation_batch_size: int = Field(
        32, ge=1, description="Perturbed copies per forward in occlusion and feature ablation (memory bound)."
    )
    max_gradient_shap_samples: int = Field(
        128, description="GradientSHAP samples per input (all of one input's samples go through one forward)."
    )
    max_conductance_steps: int = Field(
        512, description="Layer conductance steps (layer_integrated_gradients takes max_ig_steps)."
    )
    max_upload_bytes: int = Field(2048 * MiB, ge=1, description="One checkpoint upload (POST /checkpoints/inspect).")
    max_concurrent_uploads: int = Field(
        2, ge=1, description="Checkpoint uploads received at once; 503 with Retry-After past it."
    )
    max_upload_scratch_bytes: int = Field(
        4096 * MiB,
        ge=1,
        description="Scratch disk all uploads in progress may hold together (each is written once, then removed); "
        "503 with Retry-After past it.",
    )
    max_checkpoint_entries: int = Field(
        100_000,
        ge=1,
        description="Tensors and dict, list or set items one checkpoint may hold, counted from its zip directory, "
        "safetensors header or pickle opcodes before anything is loaded: 413 over it.",
    )
    max_checkpoint_depth: int = Field(
        64, ge=1, description="How deeply a checkpoint may nest its values, read from its pickle opcodes: 413 over it."
    )
    max_checkpoint_scan_s: float = Field(
        20.0, gt=0, description="Seconds the checks before loading a checkpoint may take: 413 after them."
    )
    # data-set jobs (POST /jobs)
    data_dir: Path | None = Field(
        None, description="Root of the image-folder data sets jobs may read; unset = only the built-in `digits`."
    )
    jobs_dir: Path | None = Field(
        None, description="Where jobs keep their database, checkpoints and results; unset = `<model_dir>/.jobs`."
    )
    max_job_bytes: int = Field(
        256 * MiB, ge=1, description="Disk one job's checkpoint and result may take, estimated before it starts: 413."
    )
    max_running_jobs: int = Field(1, ge=1, description="Jobs running at once; later ones wait `queued`.")
    max_jobs: int = Field(1000, ge=1, description="Jobs kept (finished ones included) before POST /jobs answers 409.")
    job_chunk_size: int = Field(
        32, ge=1, description="Samples per chunk of a job: one low-priority hooked batch; cancel stops within one."
    )
    job_checkpoint_s: float = Field(
        5.0, ge=0, description="Seconds between a running job's checkpoints (0: after every chunk)."
    )
    request_timeout_s: float = Field(120.0, description="Per-request deadline (504 after it).")
    shutdown_grace_s: float = Field(
        30.0,
        description="On SIGTERM: in-flight work may finish within this; then, at exit, each model still "
        "loading gets as long again (a load torn down inside torch aborts the process).",
    )
    load_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Seconds a model may take to load; past them it is failed and its load abandoned "
        "(its thread, which cannot be stopped, runs on, but what it builds is never served).",
    )
