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

from bench.attention_report import section as attention_section
from bench.features_report import section as features_section
from bench.loadgen import format_roles
from bench.machine import NOISY_CORES

Results = Mapping[str, Any]


@dataclass(frozen=True)
class Target:
    """One target (of issue 5 or 12), evaluated on one run."""

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
    for config, entry in results.get("configs", {}).items():
        if entry.get("baseline_of"):  # another commit's server, measured for issue 12's before/after only
            continue
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


PREDICT_JPEG = "predict-jpeg-multipart"
MIXED_SHARE = 0.30  # issue 12: each kind's share of the completions under the mixed load, at least
MIXED_TAIL = 4.0  # issue 12: each kind's max latency under the mixed load, at most this times its own p50
# issue 12: (kind, clients, bound, name): images/s of the kind over /predict's (JPEG upload) at the same clients
INTROSPECTION_RATIOS: tuple[tuple[str, int, float, str], ...] = (
    ("activations-layer4-mean-jpeg", 8, 0.9, "/activations layer4 reduced, 8 clients / /predict, 8 clients (JPEG)"),
    ("activations-allconv-st-jpeg", 8, 0.7, "/activations every Conv2d safetensors, 8 clients / /predict (JPEG)"),
    ("saliency-gradcam-jpeg", 8, 0.7, "/saliency gradcam, 8 clients / /predict, 8 clients (JPEG)"),
    ("activations-layer4-mean-jpeg", 64, 0.7, "/activations layer4 reduced, 64 clients / /predict, 64 clients"),
)
GRADCAM_P50 = 1.3  # issue 12: gradcam p50 at 1 client over /predict's (tensor input), at most
GRADCAM_P50_NAME = "/saliency gradcam p50 / /predict p50, 1 client (tensor input)"
BEFORE_AFTER = 1.1  # issue 12: /predict JPEG at 32 clients over today's main's in the same run, at least
BEFORE_AFTER_NAME = "/predict JPEG, 32 clients / today's main"
PAIRED_CONFIG = "default"  # the config bench/paired.py measures its ratios on


def _ratio(top: float, bottom: float) -> float:
    """top / bottom, NaN where the bottom is 0 or unknown (a point in which nothing succeeded)."""
    return top / bottom if bottom and not math.isnan(bottom) else float("nan")


def introspection_targets(results: Results) -> list[Target]:
    """Issue 12's targets, for every server config that has the points (baseline servers are the references).

    A ratio also measured in alternating windows (bench/paired.py, config `default`) is judged on those.
    """
    targets: list[Target] = []
    for config, entry in results.get("configs", {}).items():
        if entry.get("baseline_of"):
            continue
        targets += _mixed_targets(results, config)
        single = _ratio_targets(results, config) + _before_after_targets(results, config)
        if config == PAIRED_CONFIG and results.get("pairs"):
            paired = [_paired_target(pair) for pair in results["pairs"]]
            single = [t for t in single if _stands_for(t, results["pairs"]) is None]
            targets += paired
        targets += single
    return [t for t in targets if not (math.isnan(t.limit) or math.isnan(t.measured))]


def _paired_target(pair: Mapping[str, Any]) -> Target:
    name = f"{pair['name']} [median of {len(pair['rounds'])} ABBA rounds]"
    return Target(name, PAIRED_CONFIG, _get(pair, "ratio"), pair["bound"], "x", pair["higher_is_better"])


def _stands_for(single: Target, pairs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The paired measurement of a single-window ratio target, if there is one."""
    for pair in pairs:
        if pair["name"] == single.name or (pair["bottom"]["before"] and single.name.startswith(BEFORE_AFTER_NAME)):
            return pair
    return None


def paired_table(results: Results) -> str:
    """Each paired ratio: every round's, their median, and the same ratio from the single-window points."""
    single = {t.name: t for t in _ratio_targets(results, PAIRED_CONFIG) + _before_after_targets(results, PAIRED_CONFIG)}
    rows = [
        "| ratio | top / bottom per round | ratio per round | median | single windows | bound | result |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for pair in results.get("pairs", []):
        target = _paired_target(pair)
        apart = [t for t in single.values() if _stands_for(t, [pair]) is pair]
        sides = ", ".join(f"{_num(r['top'])} / {_num(r['bottom'])}" for r in pair["rounds"])
        ratios = ", ".join(_num(r["ratio"], 3) for r in pair["rounds"])
        unit = "images/s" if pair["stat"] == "images_per_s" else "p50 ms"
        sign = ">=" if pair["higher_is_better"] else "<="
        rows.append(
            f"| {pair['name']} | {sides} ({unit}) | {ratios} | {_num(target.measured, 3)} | "
            f"{_num(apart[0].measured, 3) if apart else 'n/a'} | {sign} {_num(target.limit, 2)} | {target.verdict} |"
        )
    return "\n".join(rows)


def _mixed_targets(results: Results, config: str) -> list[Target]:
    """Under each mixed load: every kind's share of the completions, and its max latency over its own p50."""
    targets: list[Target] = []
    for mix in _mixes(results, config):
        clients = mix["concurrency"]
        for part in mix["result"]["parts"]:
            kind = part["name"]
            share = _get(part, "share")
            p50, top = _get(part, "lat_ms", "p50"), _get(part, "lat_ms", "max")
            name = f"mixed {mix['name']}, {clients} clients: {kind}"
            targets.append(Target(f"{name} share of completions", config, share, MIXED_SHARE, "x", True))
            targets.append(Target(f"{name} max / own p50 latency", config, _ratio(top, p50), MIXED_TAIL, "x", False))
    return targets


def _ratio_targets(results: Results, config: str) -> list[Target]:
    """Introspection images/s over /predict's under the same load; gradcam's p50 over /predict's at 1 client."""
    targets: list[Target] = []
    for kind, clients, bound, name in INTROSPECTION_RATIOS:
        got = _get(_point(results, config, kind, clients), "result", "images_per_s")
        reference = _get(_point(results, config, PREDICT_JPEG, clients), "result", "images_per_s")
        targets.append(Target(name, config, _ratio(got, reference), bound, "x", True))
    gradcam = _get(_point(results, config, "saliency-gradcam", 1), "result", "lat_ms", "p50")
    predict = _get(_point(results, config, "predict-tensor", 1), "result", "lat_ms", "p50")
    targets.append(Target(GRADCAM_P50_NAME, config, _ratio(gradcam, predict), GRADCAM_P50, "x", False))
    return targets


def _before_after_targets(results: Results, config: str) -> list[Target]:
    """/predict JPEG at 32 clients over the same point of each server that ran an earlier commit of this config."""
    targets: list[Target] = []
    got = _get(_point(results, config, PREDICT_JPEG, 32), "result", "images_per_s")
    for before, entry in _baselines_of(results, config):
        reference = _get(_point(results, before, PREDICT_JPEG, 32), "result", "images_per_s")
        name = f"{BEFORE_AFTER_NAME} ({entry.get('ref', before)}) in the same run"
        targets.append(Target(name, config, _ratio(got, reference), BEFORE_AFTER, "x", True))
    return targets


def _mixes(results: Results, config: str) -> list[Mapping[str, Any]]:
    return [m for m in results.get("mixes", []) if m["config"] == config]


def _baselines_of(results: Results, config: str) -> list[tuple[str, Mapping[str, Any]]]:
    configs: Mapping[str, Mapping[str, Any]] = results.get("configs", {})
    return [(name, entry) for name, entry in configs.items() if entry.get("baseline_of") == config]


TORCH_PATH_CONFIG = "torch-path"  # bench.configs.TORCH_PATH: the default settings without ONNX Runtime


def torch_path_table(results: Results) -> str:
    """/predict on ONNX Runtime over the torch path: paired medians where measured, else single windows."""
    records = results.get("prediction_paths", [])
    if records:
        rows = ["| ratio | ONNX Runtime / torch path per round | ratio per round | median |", "|---|---|---|---:|"]
        for record in records:
            unit = "images/s" if record["stat"] == "images_per_s" else "p50 ms"
            sides = ", ".join(f"{_num(r['top'])} / {_num(r['bottom'])}" for r in record["rounds"])
            ratios = ", ".join(_num(r["ratio"], 3) for r in record["rounds"])
            rows.append(f"| {record['name']} | {sides} ({unit}) | {ratios} | {_num(_get(record, 'ratio'), 3)} |")
        return "\n".join(rows)
    rows = [
        "| /predict (single windows, minutes apart) | ONNX Runtime path | torch path | ratio |",
        "|---|---:|---:|---:|",
    ]
    for kind, clients, path in (
        ("predict-tensor", 1, ("result", "lat_ms", "p50")),
        (PREDICT_JPEG, 8, ("result", "images_per_s")),
        (PREDICT_JPEG, 32, ("result", "images_per_s")),
    ):
        onnx = _get(_point(results, PAIRED_CONFIG, kind, clients), *path)
        torch_path = _get(_point(results, TORCH_PATH_CONFIG, kind, clients), *path)
        unit = "p50 ms" if path[-1] == "p50" else "images/s"
        rows.append(
            f"| {kind}, {clients} clients ({unit}) | {_num(onnx)} | {_num(torch_path)} | "
            f"{_num(_ratio(onnx, torch_path), 3)} |"
        )
    return "\n".join(rows)


def on_the_torch_path(results: Results) -> list[str]:
    """Issue 12's paired introspection ratios moved onto the torch path: times /predict's paired ONNX Runtime gain."""
    gains = {
        (r["bottom"]["kind"], r["bottom"]["clients"]): _get(r, "ratio") for r in results.get("prediction_paths", [])
    }
    lines = []
    for pair in results.get("pairs", []):
        bottom = pair["bottom"]
        gain = gains.get((bottom["kind"], bottom["clients"]))
        if gain is None or bottom["before"]:
            continue
        lines.append(
            f"{pair['name']}: {_num(_get(pair, 'ratio') * gain, 2)} on the torch path (bound {_num(pair['bound'], 2)})"
        )
    return lines


def mixed_table(results: Results) -> str:
    """Per kind of each mixed point: completions, share, requests/s and latency, all from one window."""
    rows = [
        "| config | mix | request | clients | completions | share | requests/s | p50 ms | p99 ms | max ms | "
        "max / p50 | errors | server cores | other cores |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mix in results.get("mixes", []):
        for part in mix["result"]["parts"]:
            lat = part["lat_ms"]
            noisy = " (noisy)" if part["other_cores"] > NOISY_CORES else ""
            rows.append(
                f"| {mix['config']} | {mix['name']} ({mix['concurrency']} clients, {_num(mix['seconds'], 0)} s) | "
                f"{part.get('label', part['name'])} | {part['concurrency']} | {part['ok']} | "
                f"{_num(100 * part['share'], 1)} % | {_num(part['rps'], 2)} | {_num(lat['p50'])} | "
                f"{_num(lat['p99'])} | {_num(lat['max'])} | {_num(_ratio(lat['max'], lat['p50']), 2)} | "
                f"{sum(part['errors'].values())} | {_num(part['server_cores'], 2)} | "
                f"{_num(part['other_cores'], 2)}{noisy} |"
            )
    return "\n".join(rows)


def baseline_table(results: Results) -> str:
    """Each point measured against an earlier commit's server beside the same point of this commit's."""
    rows = [
        "| request | clients | this commit: images/s | p50 ms | p99 ms | max ms | today's main: images/s | p50 ms | "
        "p99 ms | max ms | this / today's main |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    configs: Mapping[str, Mapping[str, Any]] = results.get("configs", {})
    for before, entry in configs.items():
        after = entry.get("baseline_of")
        if not after:
            continue
        for old in (p for p in results.get("points", []) if p["config"] == before):
            new = _point(results, after, old["kind"], old["concurrency"])
            cells = []
            for point in (new, old):
                cells += [_num(_get(point, "result", "images_per_s"))]
                cells += [_num(_get(point, "result", "lat_ms", q)) for q in ("p50", "p99", "max")]
            ratio = _ratio(_get(new, "result", "images_per_s"), _get(old, "result", "images_per_s"))
            rows.append(f"| {old['label']} | {old['concurrency']} | {' | '.join(cells)} | {_num(ratio, 2)} |")
    return "\n".join(rows)


def _commits_line(results: Results) -> str:
    """Which commit each server ran, for the before/after section."""
    configs: Mapping[str, Mapping[str, Any]] = results.get("configs", {})
    return "; ".join(f"`{name}` ran `{c.get('commit', '?')}`" for name, c in configs.items() if "commit" in c)


def introspection_sections(results: Results) -> list[str]:
    """RESULTS.md's issue-12 parts: its targets, the mixed load and today's main beside this commit."""
    parts: list[str] = []
    targets = introspection_targets(results)
    if targets:
        passed = sum(t.ok is True for t in targets)
        parts += [
            f"## Introspection-under-load targets: {passed} of {len(targets)} pass",
            "",
            targets_table(targets),
            "",
        ]
    if results.get("pairs"):
        parts += [
            "## Introspection ratios in alternating windows",
            "",
            paired_table(results),
            "",
            "Both sides of each ratio measured in turn on the `default` server (and today's main's, up beside it), "
            "top first in even rounds and bottom first in odd ones (ABBA), so that the machine's drift over minutes "
            "falls on both; the targets above judge these medians. `single windows` is the same ratio from the "
            "points below, measured minutes apart.",
            "",
        ]
    if results.get("mixes"):
        parts += [
            "## Mixed load",
            "",
            mixed_table(results),
            "",
            "Closed-loop clients assigned to the kinds round-robin, all measured over the same window; `share` is "
            "the kind's fraction of all completions, `max / p50` its worst latency over its own median.",
            "",
        ]
    if TORCH_PATH_CONFIG in results.get("configs", {}):
        parts += [
            "## ONNX Runtime's prediction path against the torch path",
            "",
            torch_path_table(results),
            "",
            f"`{TORCH_PATH_CONFIG}` is `{PAIRED_CONFIG}` with `HOOKSERVE_ONNXRUNTIME=false`: its predictions run on "
            "the BatchNorm-folded torch copy, as on main before ONNX Runtime. Hooked requests run the same on both, so "
            "the introspection ratios, whose bottom is /predict, move onto the torch path by the factor above:",
            "",
            *(f"- {line}" for line in on_the_torch_path(results)),
            "",
        ]
    if any(c.get("baseline_of") for c in results.get("configs", {}).values()):
        parts += [
            "## Before the scheduler rewrite (today's main then) beside this commit, same run",
            "",
            baseline_table(results),
            "",
            f"{_commits_line(results)}. Today's main ran from a temporary `git worktree` with the same settings, "
            "interpreter and packages, right after `default`; only the `service` package differed.",
            "",
        ]
    return parts


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
    """(batches run, mean samples per batch) from a point's metric differences: prediction and hooked batches
    together, since a point measures one kind of request."""
    count = sum(v for k, v in extra.items() if k.endswith(".batches"))
    samples = sum(v for k, v in extra.items() if k.endswith(".samples"))
    return int(count), (samples / count if count else float("nan"))


def cpu_table(results: Results) -> str:
    rows = [
        "| config | request | clients | server cores | load generator cores | loadgen CPU ms/request | "
        "machine busy cores | other cores | batches | mean batch | server CPU ms/request by thread | attempt |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for p in results.get("points", []):
        r = p["result"]
        noisy = " (noisy)" if r["other_cores"] > NOISY_CORES else ""
        count, mean = batches(r.get("extra", {}))
        rows.append(
            f"| {p['config']} | {p['label']} | {p['concurrency']} | {_num(r['server_cores'], 2)} | "
            f"{_num(r['loadgen_cores'], 2)} | {_num(r['loadgen_cpu_ms_per_req'], 2)} | "
            f"{_num(r['machine_cores'], 2)} | {_num(r['other_cores'], 2)}{noisy} | {count or '-'} | "
            f"{_num(mean, 2) if count else '-'} | {format_roles(r.get('server_cpu_ms', {})) or '-'} | "
            f"{p.get('attempt', 1)} |"
        )
    return "\n".join(rows)


def render_markdown(results: Results, title: str = "hookserve benchmark", more: str = "") -> str:
    """The whole RESULTS.md; `more` (Markdown sections rendered elsewhere, e.g. the cluster row's) goes before the
    Notes."""
    m = results.get("machine", {})
    versions = ", ".join(f"{k} {v}" for k, v in results.get("versions", {}).items())
    configs = "\n".join(
        f"- `{name}`: {c['description']}; env `{' '.join(f'{k}={v}' for k, v in c['env'].items())}`"
        + (f"; commit `{c['commit']}`" if "commit" in c else "")
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
            [f"## Serving targets against raw torch: {passed} of {len(targets)} pass", "", targets_table(targets), ""]
            if targets
            else []
        ),
        *introspection_sections(results),
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
        "quietest attempt. `batches` and `mean batch`: the server's batches during the window, prediction "
        "batches for /predict rows (`hookserve_batch_size` in /metrics) and hooked batches for introspection rows "
        "(`hookserve_hooked_batch_size`). `server CPU ms/request by thread`: the server's CPU time per completed "
        "request, split by what its threads do (they name themselves, `service/runtime/os_threads.py`): `model` the "
        "executor and wide threads (forwards, hooks, captures, with torch's intra-op workers), `decode` the decode "
        "pool, `event loop` the main thread (HTTP, routes, sending answers), `other` the rest (the threadpool "
        "of sync code, loads, and ONNX Runtime's own intra-op worker, which a prediction running alone on "
        "several threads uses: at 1 client most of a /predict's CPU shows there).",
    ]
    parts += features_section(results)
    parts += attention_section(results)
    if more.strip():
        parts += ["", more.strip()]
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
    from bench import cluster  # its table needs the bench's workload kinds: imported only here, not by the report

    (args.out or args.results.with_suffix(".md")).write_text(render_markdown(results, more=cluster.markdown(results)))


if __name__ == "__main__":
    main()
