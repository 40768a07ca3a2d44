"""The protocol fronts against each other and against TorchServe, in alternating windows (ABBA, as `bench.paired`).

1. **gRPC against REST**: `tritonclient.grpc` and `tritonclient.http` (binary tensors), both their asyncio
   clients, each sending resnet18 the JPEG as a BYTES input and asking for the top 5
   (classification extension): /predict's work, over the two /v2 transports of one server. At 8
   and 32 closed-loop clients; the target is gRPC >= REST. The two answers are compared first.
2. **The TorchServe front against TorchServe 0.12**: the shared TorchServe bench's archive
   (`make_model.py`: resnet18, seeded weights, the stock `image_classifier` handler) registered on
   both, TorchServe in its best configuration measured on this machine (2 workers x
   OMP_NUM_THREADS=1, batch_size=8, max_batch_delay=5), hookserve with the same batching; both
   driven by that bench's own `loadgen.py` (httpx, the JPEG as the body). At 8 and 32 clients;
   the target is hookserve >= 1.4 x TorchServe. TorchServe runs from its own venv (`--ts-venv`,
   see the shared bench's README); the answers of both are compared first.

    .venv/bin/python -m bench.protocols                      # both; writes bench/RESULTS_PROTOCOLS.md and .json
    .venv/bin/python -m bench.protocols --skip-torchserve --rounds 1 --window 5   # a quick look at gRPC
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.configs import DEFAULT
from bench.machine import machine_info, wait_idle
from bench.server import REPO, Server, ServerConfig, free_port
from bench.stats import percentile
from bench.workload import make_inputs

CLIENTS = (8, 32)
GRPC_TARGET = 1.0
TORCHSERVE_TARGET = 1.4
ADMIN = "bench-admin"
TS_BEST = {"initial_workers": "2", "batch_size": "8", "max_batch_delay": "5"}  # with OMP_NUM_THREADS=1
LENET_ONLY = (  # beside the archive: not the built-in resnet18, whose name the archive's model takes
    '[[models]]\nname = "lenet"\nsource = "python"\narchitecture = "service.zoo.lenet:LeNet"\n'
    "input_size = [3, 32, 32]\n"
)
Log = Callable[[str], None]


@dataclass
class Window:
    side: str
    clients: int
    images_per_s: float
    p50_ms: float
    ok: int
    errors: int


@dataclass
class Row:
    """A ratio measured in `rounds` ABBA rounds: `top` over `bottom` images/s, the median judged."""

    name: str
    clients: int
    target: float
    windows: list[Window] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios) if self.ratios else float("nan")


def alternate(row: Row, rounds: int, sides: tuple[Callable[[], Window], Callable[[], Window]], log: Log) -> Row:
    """Measure both sides `rounds` times, top first in even rounds and bottom first in odd ones."""
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        found: dict[int, Window] = {}
        for i in order:
            wait_idle(60, log=log)
            found[i] = sides[i]()
            log(f"  {found[i].side} x{found[i].clients}: {found[i].images_per_s:.1f} images/s")
        row.windows += [found[0], found[1]]
        if found[1].images_per_s > 0:
            row.ratios.append(found[0].images_per_s / found[1].images_per_s)
    return row


async def closed_loop(
    call: Callable[[], Awaitable[None]], clients: int, seconds: float
) -> tuple[int, int, list[float], float]:
    """`clients` coroutines calling `call` back to back for `seconds` after 2 x clients warm-up calls."""
    await asyncio.gather(*(call() for _ in range(2 * clients)))
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            try:
                await call()
            except Exception:
                errors += 1
                continue
            latencies.append(time.perf_counter() - began)

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return len(latencies), errors, latencies, time.perf_counter() - began


# ---- 1. gRPC against REST ------------------------------------------------------------------


def triton_window(kind: str, url: str, jpeg: bytes, clients: int, seconds: float) -> Window:
    """One window of `clients` tritonclient.<kind>.aio clients sending resnet18 the JPEG, top 5 asked."""

    async def run() -> Window:
        if kind == "grpc":
            import tritonclient.grpc.aio as triton
        else:
            import tritonclient.http.aio as triton
        client = (
            triton.InferenceServerClient(url)
            if kind == "grpc"
            else triton.InferenceServerClient(url, conn_limit=clients)
        )
        image = triton.InferInput("input__0", [1], "BYTES")
        image.set_data_from_numpy(np.array([jpeg], dtype=np.object_))
        top5 = [triton.InferRequestedOutput("output__0", class_count=5)]

        async def call() -> None:
            await client.infer("resnet18", [image], outputs=top5)

        try:
            ok, errors, latencies, wall = await closed_loop(call, clients, seconds)
        finally:
            await client.close()
        return Window(kind, clients, ok / wall, 1000 * percentile(sorted(latencies), 50), ok, errors)

    return asyncio.run(run())


def triton_answers(http_url: str, grpc_url: str, jpeg: bytes) -> tuple[list[str], list[str]]:
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp

    answers = []
    for module, url in ((tgrpc, grpc_url), (thttp, http_url)):
        client = module.InferenceServerClient(url)
        image = module.InferInput("input__0", [1], "BYTES")
        image.set_data_from_numpy(np.array([jpeg], dtype=np.object_))
        found = client.infer("resnet18", [image], outputs=[module.InferRequestedOutput("output__0", class_count=5)])
        answers.append([item.decode() for item in found.as_numpy("output__0").reshape(-1)])
        client.close()
    return answers[0], answers[1]


def grpc_rows(work: Path, rounds: int, window: float, log: Log) -> dict[str, Any]:
    jpeg = make_inputs().jpeg
    grpc_port = free_port()
    cfg = ServerConfig(
        DEFAULT.config.name, DEFAULT.config.description, {**DEFAULT.config.env, "HOOKSERVE_GRPC_PORT": str(grpc_port)}
    )
    with Server(cfg, free_port(), work / "grpc") as server:
        http_url, grpc_url = server.url.removeprefix("http://"), f"127.0.0.1:{grpc_port}"
        over_grpc, over_http = triton_answers(http_url, grpc_url, jpeg)
        log(f"top 5 over gRPC {over_grpc}, over REST {over_http}")
        rows = []
        for c in CLIENTS:
            name = f"tritonclient.grpc / tritonclient.http (binary), resnet18 JPEG top-5, {c} clients"
            sides = (
                functools.partial(triton_window, "grpc", grpc_url, jpeg, c, window),
                functools.partial(triton_window, "http", http_url, jpeg, c, window),
            )
            rows.append(alternate(Row(name, c, GRPC_TARGET), rounds, sides, log))
    return {"answers_equal": over_grpc == over_http, "answers": [over_grpc, over_http], "rows": rows}


# ---- 2. the TorchServe front against TorchServe 0.12 ---------------------------------------


@contextmanager
def torchserve(ts_venv: Path, store: Path, workdir: Path, log: Log) -> Iterator[tuple[str, str]]:
    """TorchServe 0.12 with the shared bench's config.properties, on free loopback ports; stopped by PID."""
    inference, management, metrics = free_port(), free_port(), free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.properties").write_text(
        f"inference_address=http://127.0.0.1:{inference}\nmanagement_address=http://127.0.0.1:{management}\n"
        f"metrics_address=http://127.0.0.1:{metrics}\ndisable_token_authorization=true\nenable_model_api=true\n"
        "default_workers_per_model=1\ndisable_system_metrics=true\ninstall_py_dep_per_model=false\njob_queue_size=100\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{ts_venv / 'bin'}:{os.environ.get('PATH', '')}"}
    command = [str(ts_venv / "bin" / "torchserve"), "--start", "--foreground", "--ncs"]
    command += ["--ts-config", str(workdir / "config.properties"), "--model-store", str(store)]
    with open(workdir / "torchserve.out", "wb") as out:
        proc = subprocess.Popen(
            command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        url = f"http://127.0.0.1:{inference}"
        _wait(lambda: httpx.get(f"{url}/ping", timeout=2).status_code == 200, proc, "TorchServe /ping")
        log(f"TorchServe 0.12 up (pid {proc.pid})")
        yield url, f"http://127.0.0.1:{management}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: the launcher, the Java frontend, the workers
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _wait(ready: Callable[[], bool], proc: subprocess.Popen[bytes] | None, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {proc.returncode}")
        try:
            if ready():
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{what}: not ready after {timeout:g} s")


def loadgen_window(
    ts_bench: Path, side: str, url: str, jpeg: Path, *, clients: int, seconds: float, out: Path
) -> Window:
    """One window of the shared TorchServe bench's own load generator (httpx, the JPEG as the body)."""
    result = out / f"{side}-{clients}-{time.monotonic_ns()}.json"
    command = [sys.executable, "loadgen.py", "--url", url, "--file", str(jpeg), "--concurrency", str(clients)]
    command += ["--duration", str(seconds), "--requests", "100000", "--warmup-requests", str(2 * clients)]
    command += ["--warmup-seconds", "10", "--json", str(result)]
    subprocess.run(command, cwd=ts_bench, check=True, capture_output=True, timeout=seconds + 120)
    found = json.loads(result.read_text())
    errors = found["errors"]
    return Window(
        side, clients, float(found["rps"]), float(found["lat_ms"]["p50"]), int(found["ok"]), sum(errors.values())
    )


def torchserve_rows(
    ts_bench: Path, ts_venv: Path, work: Path, *, rounds: int, window: float, log: Log
) -> dict[str, Any]:
    built = work / "ts-work"
    env = {**os.environ, "PATH": f"{ts_venv / 'bin'}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    subprocess.run([str(ts_venv / "bin" / "python"), "make_model.py", "--workdir", str(built)], cwd=ts_bench,
                   env=env, check=True, capture_output=True, timeout=600)  # fmt: skip
    store, jpeg = built / "model_store", built / "input.jpg"
    management_port = free_port()
    cfg = ServerConfig(
        "torchserve-front",
        "the Settings defaults, serving the shared bench's resnet18.mar through the TorchServe front",
        {
            **DEFAULT.config.env,
            "HOOKSERVE_TORCHSERVE_MANAGEMENT_PORT": str(management_port),
            "HOOKSERVE_ADMIN_TOKEN": ADMIN,
        },
        config_toml=LENET_ONLY,
    )
    registration = {"url": "resnet18.mar", "model_name": "resnet18", "synchronous": "true"}
    with (
        torchserve(ts_venv, store, work / "ts-run", log) as (ts_url, ts_management),
        Server(cfg, free_port(), store) as hs,
    ):
        answer = httpx.post(f"{ts_management}/models", params=registration | TS_BEST, timeout=300)
        answer.raise_for_status()
        _wait(
            lambda: (
                sum(w["status"] == "READY" for w in httpx.get(f"{ts_management}/models/resnet18").json()[0]["workers"])
                >= 2
            ),
            None,
            "TorchServe workers",
        )
        mine = {"batch_size": "8", "max_batch_delay": "5"}
        answer = httpx.post(f"http://127.0.0.1:{management_port}/models", params=registration | mine,
                            headers={"Authorization": f"Bearer {ADMIN}"}, timeout=300)  # fmt: skip
        answer.raise_for_status()
        theirs = httpx.post(f"{ts_url}/predictions/resnet18", content=jpeg.read_bytes(), timeout=60).json()
        ours = httpx.post(f"{hs.url}/predictions/resnet18", content=jpeg.read_bytes(), timeout=60).json()
        same = list(theirs) == list(ours) and all(abs(theirs[k] - ours[k]) < 1e-3 for k in theirs)
        log(f"TorchServe answers {theirs}\nhookserve answers {ours}")
        rows = []
        for c in CLIENTS:
            name = f"TorchServe front / TorchServe 0.12 best config, resnet18.mar, {c} clients"
            sides = tuple(
                functools.partial(
                    loadgen_window,
                    ts_bench,
                    who,
                    f"{url}/predictions/resnet18",
                    jpeg,
                    clients=c,
                    seconds=window,
                    out=work,
                )
                for who, url in (("hookserve", hs.url), ("torchserve", ts_url))
            )
            rows.append(alternate(Row(name, c, TORCHSERVE_TARGET), rounds, (sides[0], sides[1]), log))
    return {"answers_equal": same, "answers": [ours, theirs], "rows": rows}


# ---- report ----------------------------------------------------------------------------------


def report(results: dict[str, Any]) -> str:
    lines = [
        "# The protocol fronts: gRPC against REST, the TorchServe front against TorchServe 0.12",
        "",
        f"Run {results['started']} ({results['commit']}), `python -m bench.protocols` "
        f"({results['rounds']} ABBA rounds of {results['window']:g} s windows per row). Machine: {results['machine']}.",
        "",
        "| row | clients | rounds (top / bottom images/s) | median ratio | target | |",
        "|---|---:|---|---:|---:|---|",
    ]
    for part in ("grpc", "torchserve"):
        for row in results.get(part, {}).get("rows", []):
            pairs = zip(row["windows"][0::2], row["windows"][1::2], strict=True)
            rounds = ", ".join(f"{a['images_per_s']:.1f} / {b['images_per_s']:.1f}" for a, b in pairs)
            ratio = statistics.median(row["ratios"]) if row["ratios"] else float("nan")
            verdict = "pass" if ratio >= row["target"] else "FAIL"
            lines.append(
                f"| {row['name']} | {row['clients']} | {rounds} | {ratio:.2f} | >= {row['target']:g} | {verdict} |"
            )
    lines.append("")
    for part, what in (
        ("grpc", "gRPC and REST answers (top 5)"),
        ("torchserve", "hookserve's and TorchServe's answers"),
    ):
        if part in results:
            equal = "equal" if results[part]["answers_equal"] else "DIFFERENT"
            lines.append(f"- {what}: {equal}: `{json.dumps(results[part]['answers'])[:400]}`")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window", type=float, default=10.0, help="measured seconds per window")
    parser.add_argument("--skip-grpc", action="store_true")
    parser.add_argument("--skip-torchserve", action="store_true")
    parser.add_argument("--ts-bench", type=Path, default=REPO.parent / "shared" / "bench" / "torchserve")
    parser.add_argument("--ts-venv", type=Path, default=Path(os.environ.get("TS_VENV", Path.home() / "ts-venv")))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "RESULTS_PROTOCOLS.md")
    args = parser.parse_args(argv)
    log: Log = lambda text: print(text, flush=True)  # noqa: E731
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout
    results: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit.strip(),
        "rounds": args.rounds,
        "window": args.window,
        "machine": ", ".join(f"{k} {v}" for k, v in machine_info().items()),
    }
    with tempfile.TemporaryDirectory(prefix="hookserve-protocols-") as tmp:
        work = Path(tmp)
        if not args.skip_grpc:
            results["grpc"] = grpc_rows(work, args.rounds, args.window, log)
        if not args.skip_torchserve:
            results["torchserve"] = torchserve_rows(
                args.ts_bench, args.ts_venv, work, rounds=args.rounds, window=args.window, log=log
            )
    plain = json.loads(
        json.dumps(results, default=lambda o: asdict(o) | {"ratio": o.ratio} if isinstance(o, Row) else asdict(o))
    )
    args.out.with_suffix(".json").write_text(json.dumps(plain, indent=2) + "\n")
    args.out.write_text(report(plain))
    print(report(plain))


if __name__ == "__main__":
    main()
