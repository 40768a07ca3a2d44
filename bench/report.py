"""Results (a JSON-able dict) -> the comparison table, the issue's targets, and RESULTS.md.

Kept apart from the measuring code so that the tables can be checked on fake numbers.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.features_report import section as features_section
from bench.machine import NOISY_CORES

Results = Mapping[str, Any]


@dataclass(frozen=True)
class Target:
    """One target of issue 5, evaluated on one run."""

    name: str
    config: str
    measured: float
    limit: float
    unit: str
    higher_is_better: bool

    @property
    def ok(self) -> bool | None:
        if math.isnan(self.measured) or math.isnan(self.limit):
            return None
        return self.measured >= self.limit if self.higher_is_better else self.measured <= self.limit

    @property
    def verdict(self) -> str:
        return {True: "pass", False: "FAIL", None: "n/a"}[self.ok]


def _num(value: float, digits: int = 1) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _point(results: Results, config: str, kind: str, clients: int) -> Mapping[str, Any] | None:
    points: list[Mapping[str, Any]] = results.get("points", [])
    for p in points:
        if p["config"] == config and p["kind"] == kind and p["concurrency"] == clients:
            return p
    return None


def _raw(results: Results, key: str | None) -> Mapping[str, Any] | None:
    raw: Mapping[str, Mapping[str, Any]] = results.get("raw", {})
    return raw.get(key) if key else None


def _get(entry: Mapping[str, Any] | None, *path: str) -> float:
    value: Any = entry
    for step in path:
        if not isinstance(value, Mapping) or step not in value:
            return float("nan")
        value = value[step]
    return float(value) if isinstance(value, (int, float)) else float("nan")


def evaluate_targets(results: Results) -> list[Target]:
    """Every target of issue 5 that this run has numbers for, per server config.

    The issue's raw baselines are the plain (NCHW) rows; each throughput and latency target is
    also evaluated against the channels_last rows (`-cl`), which run the kernels the server runs.
    """
    targets: list[Target] = []
    for config in results.get("configs", {}):
        for suffix, note in (("", ""), ("-cl", " [raw channels_last]")):
            targets += _throughput_targets(results, config, suffix, note)
        lenet = _get(_point(results, config, "lenet-predict", 1), "result", "lat_ms", "p50")
        if not math.isnan(lenet):
            targets.append(Target("lenet /predict, 1 client p50 (ms)", config, lenet, 3.0, "ms", False))
        tensor = _get(_point(results, config, "predict-tensor", 1), "result", "lat_ms", "p50")
        ratios = [
            ("activations-allconv-st", tensor, "/activations every Conv2d, safetensors / /predict (tensor) p50", 1.3),
            ("saliency-gradcam", tensor, "/saliency gradcam / /predict (tensor) p50", 3.0),
        ]
        st1 = _get(_point(results, config, "activations-1layer-st", 1), "result", "lat_ms", "p50")
        ratios.append(("activations-1layer-json", st1, "/activations one layer JSON / safetensors p50", 1.5))
        for kind, reference, name, bound in ratios:
            got = _get(_point(results, config, kind, 1), "result", "lat_ms", "p50")
            if not math.isnan(got):
                targets.append(Target(name, config, got / reference, bound, "x", False))
    return [t for t in targets if not (math.isnan(t.limit) or math.isnan(t.measured))]


def _throughput_targets(results: Results, config: str, suffix: str, note: str) -> list[Target]:
    """Throughput against raw batch 8 and the limit; 1-client latency against raw batch 1 with the
    intra-op threads a lone job gets in this config (`HOOKSERVE_TORCH_THREADS`)."""
    env = results.get("configs", {}).get(config, {}).get("env", {})
    threads = 1 if str(env.get("HOOKSERVE_TORCH_THREADS", "2")) == "1" else 2
    e2e8 = _get(_raw(results, f"e2e-b8-t2{suffix}"), "images_per_s")
    limit = _get(_raw(results, f"limit-b8{suffix}"), "images_per_s")
    e2e1_p50 = _get(_raw(results, f"e2e-b1-t{threads}{suffix}"), "lat_ms", "p50")
    targets: list[Target] = []
    for clients in (8, 32):
        got = _get(_point(results, config, "predict-jpeg-multipart", clients), "result", "images_per_s")
        if not math.isnan(got):
            name = f"/predict JPEG, {clients} clients / raw e2e batch 8{note}"
            targets.append(Target(name, config, got / e2e8, 1.0, "x", True))
            if clients == 32:
                name = f"/predict JPEG, 32 clients / two single-thread forward limit{note}"
                targets.append(Target(name, config, got / limit, 0.95, "x", True))
    p50 = _get(_point(results, config, "predict-jpeg-multipart", 1), "result", "lat_ms", "p50")
    if not math.isnan(p50):
        plural = "s" if threads > 1 else ""
        name = f"/predict JPEG, 1 client p50 (ms) <= raw e2e batch-1 ({threads} thread{plural}) p50 + 2{note}"
        targets.append(Target(name, config, p50, e2e1_p50 + 2.0, "ms", False))
    return targets


def comparison_table(results: Results) -> str:
    """Every hookserve point beside its raw-torch counterpart from the same run."""
    rows = [
        "| config | request | clients | images/s | p50 ms | p95 ms | p99 ms | errors | raw counterpart | "
        "x raw images/s | p50 - raw p50 ms | x raw channels_last | p50 - raw channels_last p50 ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for p in results.get("points", []):
        r = p["result"]
        plain, nhwc = (_raw(results, key) for key in (p.get("baseline"), f"{p.get('baseline')}-cl"))
        cells: list[str] = []
        for raw in (plain, nhwc):
            ratio = r["images_per_s"] / raw["images_per_s"] if raw else float("nan")
            diff = r["lat_ms"]["p50"] - raw["lat_ms"]["p50"] if raw and p["concurrency"] == 1 else float("nan")
            cells += [_num(ratio, 2), _num(diff)]
        errors = sum(r["errors"].values())
        rows.append(
            f"| {p['config']} | {p['label']} | {p['concurrency']} | {_num(r['images_per_s'])} | "
            f"{_num(r['lat_ms']['p50'])} | {_num(r['lat_ms']['p95'])} | {_num(r['lat_ms']['p99'])} | {errors} | "
            f"{plain['name'] if plain else 'n/a'} | {' | '.join(cells)} |"
        )
    return "\n".join(rows)


def raw_table(results: Results) -> str:
    rows = [
        "| raw torch, in process | iterations | images/s | batch p50 ms | p95 ms | p99 ms | CPU cores | other cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results.get("raw", {}).values():
        lat = r["lat_ms"]
        rows.append(
            f"| {r['name']} | {r['iters']} | {_num(r['images_per_s'])} | {_num(lat['p50'])} | {_num(lat['p95'])} | "
            f"{_num(lat['p99'])} | {_num(r['cores'], 2)} | {_num(r['other_cores'], 2)}"
            f"{' (noisy)' if r['other_cores'] > NOISY_CORES else ''} |"
        )
    return "\n".join(rows)


def targets_table(targets: list[Target]) -> str:
    rows = ["| target | config | measured | bound | result |", "|---|---|---:|---:|---|"]
    for t in targets:
        sign = ">=" if t.higher_is_better else "<="
        digits = 1 if t.unit == "ms" else 2
        rows.append(
            f"| {t.name} | {t.config} | {_num(t.measured, digits)} | {sign} {_num(t.limit, digits)} | {t.verdict} |"
        )
    return "\n".join(rows)


def batches(extra: Mapping[str, float]) -> tuple[int, float]:
    """(prediction batches run, mean samples per batch) from a point's metric differences."""
    count = sum(v for k, v in extra.items() if k.endswith(".batches"))
    samples = sum(v for k, v in extra.items() if k.endswith(".samples"))
    return int(count), (samples / count if count else float("nan"))


def cpu_table(results: Results) -> str:
    rows = [
        "| config | request | clients | server cores | load generator cores | loadgen CPU ms/request | "
        "machine busy cores | other cores | batches | mean batch | attempt |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in results.get("points", []):
        r = p["result"]
        noisy = " (noisy)" if r["other_cores"] > NOISY_CORES else ""
        count, mean = batches(r.get("extra", {}))
        rows.append(
            f"| {p['config']} | {p['label']} | {p['concurrency']} | {_num(r['server_cores'], 2)} | "
            f"{_num(r['loadgen_cores'], 2)} | {_num(r['loadgen_cpu_ms_per_req'], 2)} | "
            f"{_num(r['machine_cores'], 2)} | {_num(r['other_cores'], 2)}{noisy} | {count or '-'} | "
            f"{_num(mean, 2) if count else '-'} | {p.get('attempt', 1)} |"
        )
    return "\n".join(rows)


def render_markdown(results: Results, title: str = "hookserve benchmark") -> str:
    """The whole RESULTS.md."""
    m = results.get("machine", {})
    versions = ", ".join(f"{k} {v}" for k, v in results.get("versions", {}).items())
    configs = "\n".join(
        f"- `{name}`: {c['description']}; env `{' '.join(f'{k}={v}' for k, v in c['env'].items())}`"
        for name, c in results.get("configs", {}).items()
    )
    targets = evaluate_targets(results)
    passed = sum(t.ok is True for t in targets)
    parts = [
        f"# {title}",
        "",
        f"Run {results.get('started_utc', '?')} to {results.get('finished_utc', '?')} (UTC) by "
        f"`{results.get('command', 'python -m bench.run')}`. One run on one machine; rerun to refresh "
        "(see README.md). Expect a few percent noise run to run, far more if anything else used the CPU.",
        "",
        "## Setup",
        "",
        f"- Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('mem_gib', '?')} GiB RAM, "
        f"Linux {m.get('kernel', '?')}, Python {m.get('python', '?')}, GPU: {m.get('gpu', '?')}",
        f"- Packages: {versions}",
        f"- Input: {results.get('input', '?')}",
        f"- Load: {results.get('load', '?')}",
        "- Server configs (all other settings default; access log off, `HOOKSERVE_LOG_LEVEL=warning`):",
        configs,
        "",
        *(
            [f"## Targets (issue 5): {passed} of {len(targets)} pass", "", targets_table(targets), ""]
            if targets
            else []
        ),
        "## hookserve beside raw torch (same run)",
        "",
        comparison_table(results),
        "",
        "Latency is per request as the client saw it (closed loop: at N clients, p50 is mostly queueing, "
        "about N / throughput). `x raw images/s` divides by the counterpart's images/s; `p50 - raw p50` "
        "is shown at 1 client, where the raw counterpart is a batch of 1. The server runs resnet18 "
        "channels_last (memory_format auto), so the last two columns divide by the same raw row run "
        "channels_last: the same kernels, what the server adds.",
        "",
        "## Raw torch, in process (no server running)",
        "",
        raw_table(results),
        "",
        "`forward only` runs the model on a fixed tensor; `decode+preprocess+forward` decodes the JPEG with PIL, "
        "runs the service's `preprocess_image` (resize 256, crop 224, normalize), stacks, runs the model and "
        "takes softmax top-5. The side-by-side row runs two processes with one torch thread each at once "
        "(images/s is their sum; its latency column is each process's mean batch time): the machine's limit. "
        "`on a worker thread` runs on a new thread that sets its own thread count while the main thread's "
        "2-thread OpenMP team still exists, as the service's executor threads do beside its loader and decode "
        "threads; slower than the same row on the main thread means libgomp's throttled spinning (more "
        "OpenMP threads alive than cores) is costing the service too.",
        "",
        "## Where the CPU went (cores, averaged over each measured window)",
        "",
        cpu_table(results),
        "",
        f"`other` = whole machine busy minus the server and the load generator (kernel, other processes); "
        f"above {NOISY_CORES} cores a point is flagged noisy and redone up to `--retries` times, keeping the "
        "quietest attempt. `batches` and `mean batch`: the server's prediction batches during the window "
        "(`hookserve_batch_size` in /metrics).",
    ]
    parts += features_section(results)
    notes = results.get("notes")
    if notes:
        parts += ["", "## Notes", "", str(notes).strip()]
    return "\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """Re-render a report from a run's JSON, e.g. to add notes written after the run."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("results", type=Path, help="the JSON a run wrote (bench/RESULTS.json)")
    ap.add_argument("--notes", type=Path, default=None, help="Markdown appended as the report's Notes")
    ap.add_argument("--out", type=Path, default=None, help="default: the JSON's path with .md")
    args = ap.parse_args(argv)
    results = dict(json.loads(args.results.read_text()))
    if args.notes is not None:
        results["notes"] = args.notes.read_text()
        args.results.write_text(json.dumps(results, indent=2) + "\n")
    (args.out or args.results.with_suffix(".md")).write_text(render_markdown(results))


if __name__ == "__main__":
    main()
