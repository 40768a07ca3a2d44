"""Prometheus metrics: one CollectorRegistry per app (tests build many apps), `GET /metrics`.

Request counters and histograms are updated by the observability middleware and the
executors' job callback (batch sizes, time queued, time running); model state, load time,
queue depth and device memory are read from the Fleet at scrape time by a custom
collector, so they are never stale.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterable

import torch
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from service.registry.loaded import LoadedModel
from service.runtime.executor import JobObserver, JobRecord
from service.runtime.fleet import Fleet, Status
from service.runtime.jobs import JobKind

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

FleetSource = Callable[[], Fleet | None]


class FleetCollector(Collector):
    """Scrape-time gauges over the model registry (and CUDA memory when a GPU is present)."""

    def __init__(self, source: FleetSource) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        state = GaugeMetricFamily(
            "hookserve_model_state", "1 for the model's current status, 0 for the others.", labels=["model", "state"]
        )
        load = GaugeMetricFamily("hookserve_model_load_seconds", "Seconds the model took to load.", labels=["model"])
        depth = GaugeMetricFamily(
            "hookserve_queue_depth", "Jobs waiting in the model's executor queue.", labels=["model"]
        )
        abandoned = GaugeMetricFamily(
            "hookserve_abandoned_loads",
            "Model loads given up (past load_timeout_s, or their model removed) whose thread still runs: "
            "a Python thread cannot be stopped, and what it builds is discarded.",
        )
        registry = self._source()
        abandoned.add_metric([], float(registry.abandoned_loads) if registry is not None else 0.0)
        for entry in registry.entries() if registry is not None else []:
            name = entry.spec.name
            for status in Status:
                state.add_metric([name, status.value], 1.0 if entry.status is status else 0.0)
            if entry.load_seconds is not None:
                load.add_metric([name], entry.load_seconds)
            if entry.executor is not None:
                depth.add_metric([name], float(entry.executor.queue_depth))
        yield from (state, load, depth, abandoned)
        models = [entry.model for entry in registry.entries() if entry.model is not None] if registry else []
        yield from capture_plan_families(models)
        yield from device_memory_families()


def capture_plan_families(models: list[LoadedModel]) -> list[Metric]:
    """Capture batches by engine, the plans each model holds, and the capture sets left on hooks by reason."""
    forwards = CounterMetricFamily(
        "hookserve_capture_forwards",
        "Forward-only capture batches (/activations layers, /v2 layer outputs, data-set jobs) by engine: plan (ONNX "
        "Runtime) or eager (hooks).",
        labels=["model", "engine"],
    )
    plans = GaugeMetricFamily(
        "hookserve_capture_plans", "Capture plans the model holds (at most capture_plans).", labels=["model"]
    )
    fallbacks = GaugeMetricFamily(
        "hookserve_capture_plan_fallbacks",
        "Capture sets whose plan could not be built, by reason: untraceable (FX), unsupported (a layer or value the "
        "graph cannot output), export (ONNX), mismatch (outputs differ from the hooks'), error; disabled: the "
        "model gets no plans (INFO's capture_plans.reason says why).",
        labels=["model", "reason"],
    )
    for model in models:
        cache = model.capture_plans
        for engine in ("plan", "eager"):
            forwards.add_metric([model.name, engine], float(cache.forwards[engine]))
        plans.add_metric([model.name], float(cache.size))
        reasons = collections.Counter(refused.kind for _, refused in cache.refusals())
        if not cache.enabled:
            reasons["disabled"] = 1
        for reason, count in sorted(reasons.items()):
            fallbacks.add_metric([model.name, reason], float(count))
    return [forwards, plans, fallbacks]


def device_memory_families() -> list[Metric]:
    """Allocated and reserved bytes per CUDA device; nothing when CUDA is unavailable."""
    if not torch.cuda.is_available():
        return []
    allocated = GaugeMetricFamily(
        "hookserve_device_memory_allocated_bytes", "Bytes held by tensors on the device.", labels=["device"]
    )
    reserved = GaugeMetricFamily(
        "hookserve_device_memory_reserved_bytes", "Bytes held by torch's caching allocator.", labels=["device"]
    )
    for index in range(torch.cuda.device_count()):
        device = f"cuda:{index}"
        allocated.add_metric([device], float(torch.cuda.memory_allocated(index)))
        reserved.add_metric([device], float(torch.cuda.memory_reserved(index)))
    return [allocated, reserved]


class Metrics:
    """The app's collectors: requests, latency and batch sizes, plus the registry collector."""

    def __init__(self, source: FleetSource) -> None:
        self.source = source
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "hookserve_requests",
            "HTTP requests by route template, method, model and status code.",
            ["route", "method", "model", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "hookserve_request_duration_seconds",
            "Time from request start to the last response byte, by route template.",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "hookserve_batch_size",
            "Samples per prediction batch run by the model's executor.",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.hooked_batch_size = Histogram(
            "hookserve_hooked_batch_size",
            "Samples per hooked batch run by the model's executor: concurrent /activations, /gradients, /saliency "
            "and intervention requests answered by one forward.",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.queued = Histogram(
            "hookserve_job_queue_seconds",
            "Time a job waited from entering the model's queue until it ran (batching delay, model lock and "
            "threads included), by model and job kind (predict, exclusive: hooks, shared).",
            ["model", "kind"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.compute = Histogram(
            "hookserve_job_compute_seconds",
            "Time a prediction batch or a job ran on the model, by model and job kind.",
            ["model", "kind"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(FleetCollector(source))

    def observe_request(self, route: str, method: str, model: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, model, str(status)).inc()
        self.latency.labels(route, method).observe(seconds)

    def observe_job(self, record: JobRecord) -> None:
        """The executors' `on_job` callback (called on worker threads; prometheus-client is thread-safe)."""
        kind = record.kind.value
        if record.kind is JobKind.predict:
            self.batch_size.labels(record.model).observe(record.samples)
        elif record.kind is JobKind.exclusive and record.samples > 0:  # summaries and other input-less jobs: none
            self.hooked_batch_size.labels(record.model).observe(record.samples)
        queued = self.queued.labels(record.model, kind)
        for seconds in record.waited_s:
            queued.observe(seconds)
        self.compute.labels(record.model, kind).observe(record.ran_s)

    def forget_model(self, name: str) -> None:
        """The registry's `on_remove` callback: an unloaded model's series go with it."""
        with contextlib.suppress(KeyError):
            self.batch_size.remove(name)
        with contextlib.suppress(KeyError):
            self.hooked_batch_size.remove(name)
        for histogram in (self.queued, self.compute):
            for kind in JobKind:
                with contextlib.suppress(KeyError):
                    histogram.remove(name, kind.value)

    def knows_model(self, name: str) -> bool:
        registry = self.source()
        return registry is not None and name in registry

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition in the format the scraper asks for (classic text or OpenMetrics)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


def app_fleet(app: FastAPI) -> FleetSource:
    """Reads `app.state.hookserve.fleet`, which exists only while the lifespan runs."""

    def source() -> Fleet | None:
        state = getattr(app.state, "hookserve", None)
        fleet: Fleet | None = getattr(state, "fleet", None)
        return fleet

    return source


def metrics_of(app: FastAPI) -> Metrics:
    """The app's Metrics, created on first use and kept on `app.state.metrics`."""
    metrics: Metrics | None = getattr(app.state, "metrics", None)
    if metrics is None:
        metrics = Metrics(app_fleet(app))
        app.state.metrics = metrics
    return metrics


def job_observer(app: FastAPI) -> JobObserver:
    """Pass as `Fleet(settings, on_job=job_observer(app))`: feeds the batch-size and job-time histograms."""
    return metrics_of(app).observe_job


def removal_observer(app: FastAPI) -> Callable[[str], None]:
    """Pass as `Fleet(..., on_remove=removal_observer(app))`: drops an unloaded model's series."""
    return metrics_of(app).forget_model
