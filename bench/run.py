"""`make bench`: raw torch baselines, then hookserve over loopback in several thread configs; writes RESULTS.md.

Every point waits for an idle machine first and records where the CPU went. The server is
started here as `python -m service` and stopped by PID at the end, also on Ctrl-C.

    python -m bench.run                  # the full run (about 20 minutes on 2 idle cores)
    python -m bench.run --quick --out /tmp/try.md   # a few seconds per point, for trying
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import httpx

from bench import attention, cluster, features, gpu, paired, prediction_paths, raw_torch
from bench import baseline as main_before
from bench.configs import BASELINE_POINTS, DEFAULT, SETUPS, TORCH_PATH, Mix, Setup
from bench.loadgen import CLIENTS, Client, LoadResult, MixResult, format_mix, format_result, measure, measure_mix
from bench.machine import NOISY_CORES, machine_info, package_versions, wait_idle
from bench.payloads import Payload
from bench.report import (
    baseline_table,
    batches,
    comparison_table,
    evaluate_targets,
    introspection_targets,
    mixed_table,
    paired_table,
    render_markdown,
    targets_table,
)
from bench.server import REPO, Server, free_port
from bench.workload import (
    JPEG_INTROSPECTION_KINDS,
    LABELS,
    Inputs,
    Kind,
    baseline,
    build_payloads,
    make_inputs,
)

HERE = Path(__file__).resolve().parent
CLIENT_TEXT: dict[str, str] = {
    "wire": "lean bench.wire HTTP/1.1 client (prebuilt request bytes)",
    "httpx": "httpx AsyncClient (as TorchServe's numbers were taken)",
}
R = TypeVar("R", LoadResult, MixResult, raw_torch.RawResult)

# key: (model, mode, batch, torch threads); the limit rows (two single-thread processes) are run apart.
# `-thread` rows run on a fresh thread that sets its own torch thread count, as the service's executors do.
# `-cl` rows run NHWC (channels_last), as the service runs convolutional models by default: the issue's
# targets divide by the plain rows, and the report also divides by these (same kernels as the server).
RAW_ROWS: dict[str, tuple[str, str, int, int]] = {
    "forward-b1-t2": ("resnet18", "forward", 1, 2),
    "forward-b1-t2-thread": ("resnet18", "forward", 1, 2),
    "forward-b8-t2": ("resnet18", "forward", 8, 2),
    "e2e-b1-t2": ("resnet18", "e2e", 1, 2),
    "e2e-b8-t2": ("resnet18", "e2e", 8, 2),
    "forward-b1-t1": ("resnet18", "forward", 1, 1),
    "e2e-b1-t1": ("resnet18", "e2e", 1, 1),
    "lenet-forward-b1-t1": ("lenet", "forward", 1, 1),
    "forward-b1-t2-cl": ("resnet18", "forward", 1, 2),
    "forward-b8-t2-cl": ("resnet18", "forward", 8, 2),
    "e2e-b1-t2-cl": ("resnet18", "e2e", 1, 2),
    "e2e-b8-t2-cl": ("resnet18", "e2e", 8, 2),
    "forward-b1-t1-cl": ("resnet18", "forward", 1, 1),
    "e2e-b1-t1-cl": ("resnet18", "e2e", 1, 1),
}


@dataclass(frozen=True)
class Plan:
    """How long and how carefully each point is measured."""

    duration_s: float
    raw_s: float
    max_requests: int
    idle_wait_s: float
    retries: int
    ig_requests: int
    client: Client = "wire"
    introspection_s: float = 10.0  # issue 12's JPEG introspection points at 8 and 32 clients
    mixed_s: float | None = None  # the mixed points; None: each mix's own (20 s for issue 12's)

    def seconds(self, kind: Kind) -> float:
        """Max measured seconds of a point of this kind."""
        return min(self.duration_s, self.introspection_s) if kind in JPEG_INTROSPECTION_KINDS else self.duration_s


def log(msg: str) -> None:
    print(f"[{dt.datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


def quietest(run: Callable[[], R], plan: Plan, describe: Callable[[R], str]) -> tuple[R, int]:
    """Wait for an idle machine, run; redo while others used more than NOISY_CORES; keep the quietest."""
    best: tuple[R, int] | None = None
    for attempt in range(1, plan.retries + 2):
        wait_idle(plan.idle_wait_s, log=log)
        result = run()
        log(describe(result))
        if best is None or result.other_cores < best[0].other_cores:
            best = (result, attempt)
        if result.other_cores <= NOISY_CORES:
            break
        if attempt <= plan.retries:
            log(f"  other processes used {result.other_cores:.2f} cores meanwhile; redoing the point")
    assert best is not None  # the loop runs at least once
    return best


def run_raw(plan: Plan, jpeg: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def describe(r: raw_torch.RawResult) -> str:
        return f"{r.name}: {r.images_per_s:.1f} images/s, batch p50 {r.lat_ms['p50']:.1f} ms, other {r.other_cores:.2f}"

    for key, (arch, mode, batch, threads) in RAW_ROWS.items():
        run = partial(
            raw_torch.run_raw,
            arch,
            mode,
            batch=batch,
            threads=threads,
            jpeg=jpeg,
            seconds=plan.raw_s / 2 if arch == "lenet" else plan.raw_s,
            on_thread=key.endswith("-thread"),
            channels_last=key.endswith("-cl"),
        )
        result, _ = quietest(run, plan, describe)
        out[key] = result.to_dict()
    for key, channels_last in (("limit-b8", False), ("limit-b8-cl", True)):
        limit = partial(raw_torch.run_limit, "resnet18", 8, plan.raw_s, 2, channels_last)
        result, _ = quietest(limit, plan, describe)
        out[key] = result.to_dict()
    return out


def batch_text(r: LoadResult) -> str:
    count, mean = batches(r.extra)
    return f" batches={count} mean batch={mean:.2f}" if count else ""


def conv_layers(url: str, model: str = "resnet18") -> list[str]:
    with httpx.Client(timeout=60.0, trust_env=False) as client:
        response = client.get(f"{url}/models/{model}/layers")
        response.raise_for_status()
        return [layer["name"] for layer in response.json()["layers"] if layer["type"] == "Conv2d"]


def measure_config(
    setup: Setup, plan: Plan, port: int, workdir: Path, inputs: Inputs, *, source: Path = REPO
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Start a server in this config (from the checkout `source`), measure its points, then its mixes."""
    cfg = setup.config
    points: list[dict[str, Any]] = []
    log(f"starting hookserve ({cfg.name}: {cfg.description}) on port {port}")
    with Server(cfg, port, workdir, source=source) as server:
        payloads = build_payloads(inputs, conv_layers(server.url))
        for kind, clients in setup.points:
            payload: Payload = payloads[kind]
            ig = kind is Kind.SALIENCY_IG
            budget = plan.ig_requests if ig else plan.max_requests
            warmup = 1 if ig else None

            def run(
                payload: Payload = payload,
                clients: int = clients,
                budget: int = budget,
                warmup: int | None = warmup,
                payload_kind: Kind = kind,
            ) -> LoadResult:
                return measure(
                    server.url,
                    payload,
                    clients,
                    max_requests=budget,
                    max_seconds=plan.seconds(payload_kind),
                    warmup_requests=warmup,
                    server_pid=server.pid,
                    counters=server.batch_counters,
                    client=plan.client,
                )

            result, attempt = quietest(run, plan, lambda r: f"  {cfg.name}: {format_result(r)}{batch_text(r)}")
            if result.ok == 0:
                log(f"  no request succeeded: {result.first_error}")
            points.append(
                {
                    "config": cfg.name,
                    "kind": kind.value,
                    "label": LABELS[kind],
                    "concurrency": clients,
                    "baseline": baseline(kind, clients, cfg.torch_threads),
                    "attempt": attempt,
                    "result": result.to_dict(),
                }
            )
            if server.proc is None or server.proc.poll() is not None:
                raise RuntimeError(f"the server died during {kind.value}:\n{server.log_tail()}")
        mixes = [measure_mix_point(server, cfg.name, mix, payloads, plan) for mix in setup.mixes]
    return points, mixes


def measure_mix_point(
    server: Server, config: str, mix: Mix, payloads: dict[Kind, Payload], plan: Plan
) -> dict[str, Any]:
    """Several kinds at once (clients round-robin), each summarised apart; the record RESULTS.json keeps."""
    seconds = mix.seconds if plan.mixed_s is None else plan.mixed_s

    def run() -> MixResult:
        return measure_mix(
            server.url,
            [payloads[kind] for kind in mix.kinds],
            mix.clients,
            max_requests=plan.max_requests,
            max_seconds=seconds,
            server_pid=server.pid,
            counters=server.batch_counters,
            client=plan.client,
        )

    result, attempt = quietest(run, plan, lambda r: f"  {config} {mix.name}: {format_mix(r)}")
    if server.proc is None or server.proc.poll() is not None:
        raise RuntimeError(f"the server died during {mix.name}:\n{server.log_tail()}")
    record = result.to_dict()
    for part, kind in zip(record["parts"], mix.kinds, strict=True):
        part["label"] = LABELS[kind]
    return {
        "config": config,
        "name": mix.name,
        "kinds": [kind.value for kind in mix.kinds],
        "concurrency": mix.clients,
        "seconds": seconds,
        "attempt": attempt,
        "result": record,
    }


def measure_baseline(
    ref: str, plan: Plan, port: int, workdir: Path, inputs: Inputs
) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """Issue 12's before/after points against a second server running `ref` from a temporary worktree.

    The same settings, interpreter and venv as `default`; only the `service` package differs. Returns
    the config's name, its RESULTS.json entry (with the commit it ran) and its points.
    """
    with main_before.checkout(ref, workdir / "baseline") as before:
        cfg = replace(
            DEFAULT.config,
            name=f"{DEFAULT.config.name}@{before.short}",
            description=f"{DEFAULT.config.description}; the code of {before.ref} (before the scheduler rewrite)",
        )
        log(f"worktree of {before.ref} ({before.commit}) at {before.path}")
        points, _ = measure_config(Setup(cfg, BASELINE_POINTS), plan, port, workdir, inputs, source=before.path)
    entry = {
        "description": cfg.description,
        "env": cfg.env,
        "commit": before.commit,
        "ref": before.ref,
        "baseline_of": DEFAULT.config.name,
    }
    return cfg.name, entry, points


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--duration", type=float, default=15.0, help="max measured seconds per point (default 15)")
    ap.add_argument("--requests", type=int, default=5000, help="max measured requests per point (default 5000)")
    ap.add_argument("--raw-duration", type=float, default=10.0, help="seconds per raw torch row (default 10)")
    ap.add_argument("--quick", action="store_true", help="3 s per point, no retries: for trying, not for RESULTS.md")
    ap.add_argument("--port", type=int, default=0, help="server port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--skip-raw", action="store_true", help="no raw torch rows (ratios become n/a)")
    ap.add_argument("--configs", nargs="+", default=list(SETUPS), choices=list(SETUPS), help="server configs to run")
    ap.add_argument("--retries", type=int, default=2, help="redo a point this often when others used the CPU")
    ap.add_argument("--idle-wait", type=float, default=120.0, help="max seconds to wait for an idle machine")
    ap.add_argument(
        "--out", type=Path, default=None, help="markdown report (default bench/RESULTS.md; none with --quick)"
    )
    ap.add_argument("--json", type=Path, default=None, help="the results as JSON (default: beside the report, .json)")
    ap.add_argument("--notes", type=Path, default=None, help="Markdown to append to the report as its Notes")
    ap.add_argument(
        "--features-images", type=int, default=256, help="`hookserve features` point: copies of the JPEG (0 skips it)"
    )
    ap.add_argument("--gpu", action="store_true", help="resnet50 bfloat16 on CUDA at 64 clients (RESULTS_GPU.md)")
    ap.add_argument("--skip-cluster", action="store_true", help="no Ray Serve row (bench/cluster.py)")
    ap.add_argument(
        "--skip-attention", action="store_true", help="no vit_tiny /attention beside /predict (bench/attention.py)"
    )
    ap.add_argument(
        "--introspection-duration",
        type=float,
        default=10.0,
        help="max measured seconds of each JPEG introspection point at 8 and 32 clients (default 10)",
    )
    ap.add_argument(
        "--mixed-duration", type=float, default=None, help="seconds of each mixed point (default: its own, 20)"
    )
    ap.add_argument(
        "--baseline-ref",
        default=main_before.DEFAULT_REF,
        help=f"commit to measure beside `default` from a temporary worktree (default {main_before.DEFAULT_REF}, "
        "the last commit before the scheduler rewrite)",
    )
    ap.add_argument("--skip-baseline", action="store_true", help="no second server from --baseline-ref")
    ap.add_argument(
        "--paired-rounds",
        type=int,
        default=5,
        help="ABBA rounds of each introspection ratio in alternating windows (bench/paired.py; 0 skips; default 5)",
    )
    ap.add_argument("--paired-window", type=float, default=8.0, help="seconds of each paired window (default 8)")
    ap.add_argument(
        "--client",
        choices=CLIENTS,
        default="wire",
        help="load generator's HTTP client: wire (lean, default) or httpx (as TorchServe was measured)",
    )
    args = ap.parse_args(argv)
    if not args.skip_baseline and "default" in args.configs and not args.gpu:
        try:
            main_before.resolve(args.baseline_ref)  # fail now, not after half the run
        except RuntimeError as exc:
            ap.error(f"--baseline-ref {args.baseline_ref}: {exc} (or pass --skip-baseline)")
    if args.quick:
        args.duration, args.raw_duration, args.retries = min(args.duration, 3.0), min(args.raw_duration, 3.0), 0
        args.introspection_duration = min(args.introspection_duration, 3.0)
        args.mixed_duration = min(args.mixed_duration or 3.0, 3.0)
        args.features_images = min(args.features_images, 64)
        args.idle_wait = min(args.idle_wait, 10.0)
        args.paired_rounds, args.paired_window = min(args.paired_rounds, 1), min(args.paired_window, 3.0)
    if args.out is None and not args.quick:
        args.out = HERE / ("RESULTS_GPU.md" if args.gpu else "RESULTS.md")
    if args.json is None and args.out is not None:
        args.json = args.out.with_suffix(".json")
    return args


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)  # stop the server by PID on `kill` too
    if args.gpu:
        return gpu.main(args, log)
    ig = 1 if args.quick else 5
    plan = Plan(
        args.duration,
        args.raw_duration,
        args.requests,
        args.idle_wait,
        args.retries,
        ig,
        args.client,
        introspection_s=args.introspection_duration,
        mixed_s=args.mixed_duration,
    )
    inputs = make_inputs()
    setups = [SETUPS[name] for name in args.configs]
    commit = main_before.head_commit()
    results: dict[str, Any] = {
        "started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.run " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine_info(),
        "versions": package_versions(),
        "input": inputs.describe(),
        "load": (
            f"closed loop, asyncio in the benchmark process with the {CLIENT_TEXT[plan.client]}, keep-alive, one "
            f"connection per client; each "
            f"point min({plan.duration_s:g} s, {plan.max_requests} requests; integrated gradients "
            f"{plan.ig_requests}) after a warm-up of 2 x clients requests; before each point a wait for an idle "
            f"machine (< 0.10 cores busy over 2 s, at most {plan.idle_wait_s:g} s); raw rows {plan.raw_s:g} s each"
        ),
        "configs": {
            s.config.name: {"description": s.config.description, "env": s.config.env, "commit": commit} for s in setups
        },
        "raw": {},
        "points": [],
        "mixes": [],
        "pairs": [],
        "notes": args.notes.read_text() if args.notes is not None else "",
    }
    with tempfile.TemporaryDirectory(prefix="hookserve-bench-") as tmp:
        if not args.skip_raw:
            log("raw torch rows (no server running)")
            results["raw"] = run_raw(plan, inputs.jpeg)
        for setup in setups:
            points, mixes = measure_config(setup, plan, args.port or free_port(), Path(tmp), inputs)
            results["points"] += points
            results["mixes"] += mixes
            if setup is DEFAULT and not args.skip_baseline:  # right after it, on the same machine state
                name, entry, points = measure_baseline(
                    args.baseline_ref, plan, args.port or free_port(), Path(tmp), inputs
                )
                results["configs"][name] = entry
                results["points"] += points
            if setup is DEFAULT and args.paired_rounds > 0:
                log(f"introspection ratios in {args.paired_rounds} ABBA rounds of {args.paired_window:g} s windows")
                results["pairs"] = paired.measure_pairs(
                    inputs,
                    conv_layers,
                    Path(tmp),
                    log,
                    rounds=args.paired_rounds,
                    window_s=args.paired_window,
                    idle_wait_s=plan.idle_wait_s,
                    baseline_ref=None if args.skip_baseline else args.baseline_ref,
                    client=plan.client,
                )
        if TORCH_PATH in setups and args.paired_rounds > 0:
            log(f"/predict on ONNX Runtime and on the torch path in {args.paired_rounds + 1} ABBA rounds")
            results["prediction_paths"] = prediction_paths.measure_paths(
                inputs,
                conv_layers,
                Path(tmp),
                log,
                rounds=args.paired_rounds + 1,
                window_s=args.paired_window,
                idle_wait_s=plan.idle_wait_s,
            )
        if DEFAULT in setups and args.paired_rounds > 0 and not args.skip_attention:
            log(f"vit_tiny /attention of one block beside /predict in {args.paired_rounds} ABBA rounds")
            results["attention"] = attention.measure_attention(
                inputs,
                Path(tmp) / "attention",
                log,
                rounds=args.paired_rounds,
                window_s=args.paired_window,
                idle_wait_s=plan.idle_wait_s,
            )
        if not args.skip_cluster:
            results["cluster"] = cluster.run(
                Path(tmp),
                log,
                duration_s=plan.duration_s,
                max_requests=plan.max_requests,
                idle_wait_s=plan.idle_wait_s,
                client=plan.client,
                port=args.port,
            )
        if args.features_images > 0:
            log("hookserve features beside raw in-process feature extraction")
            workdir = Path(tmp) / "features"
            results["features"] = features.measure(args.features_images, workdir, idle_wait_s=plan.idle_wait_s, log=log)
    results["finished_utc"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    print()
    print(comparison_table(results))
    print()
    print(targets_table(evaluate_targets(results)))
    print()
    print(targets_table(introspection_targets(results)))
    print()
    print(paired_table(results))
    print()
    print(mixed_table(results))
    print()
    print(baseline_table(results))
    print()
    print(cluster.table(results.get("cluster", {})))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if args.out is not None:
        args.out.write_text(render_markdown(results, more=cluster.markdown(results)))
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; the server was stopped", file=sys.stderr)
        sys.exit(130)
