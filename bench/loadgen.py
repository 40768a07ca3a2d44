"""Closed-loop HTTP load generator (asyncio), loopback only.

`concurrency` clients each send the same prebuilt request back to back, one connection each,
until `max_requests` are sent or `max_seconds` pass; a warm-up phase runs first. It reports
requests/s, images/s, latency percentiles and its own CPU (it shares the cores it measures).
`measure_mix` runs several payloads at once (clients assigned to them round-robin) and reports
each payload apart, from the same window.
The client is `bench.wire` (prebuilt request bytes, ~0.2 ms CPU per request) by default, or
httpx (`client="httpx"`, ~1.5 ms per request), the client TorchServe's numbers were taken with.

CLI: python -m bench.loadgen --url http://127.0.0.1:8000/predict --image x.jpg -c 8 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import math
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass, field
from itertools import zip_longest
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

import httpx

from bench.machine import ROLE_ORDER, CpuMeter
from bench.payloads import Payload, b64, json_payload, multipart_payload
from bench.stats import latency_summary
from bench.wire import Connection, WireError, build_request

Client = Literal["wire", "httpx"]
CLIENTS: tuple[Client, ...] = get_args(Client)
Send = Callable[[], Awaitable[tuple[int, bytes | memoryview]]]

HARD_MAX_REQUESTS = 100_000
HARD_MAX_SECONDS = 600.0


def check_loopback(url: str) -> None:
    """Allow only loopback targets (127.0.0.0/8, ::1, or 'localhost'); other names are not even resolved."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"refusing {url!r}: scheme {parts.scheme!r}")
    host = parts.hostname
    if host is None:
        raise ValueError(f"refusing {url!r}: no host")
    if host == "localhost":
        addrs = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in socket.getaddrinfo(host, None)]
    else:
        try:
            addrs = [ipaddress.ip_address(host)]
        except ValueError:
            raise ValueError(f"refusing {url!r}: {host!r} is not a loopback IP literal or 'localhost'") from None
    for addr in addrs:
        if not addr.is_loopback:
            raise ValueError(f"refusing {url!r}: {addr} is not loopback")


@dataclass
class LoadResult:
    """One measured point."""

    name: str
    concurrency: int
    sent: int
    ok: int
    errors: dict[str, int]
    wall_s: float
    rps: float
    images_per_s: float
    lat_ms: dict[str, float]
    loadgen_cores: float
    loadgen_cpu_ms_per_req: float
    machine_cores: float
    server_cores: float
    other_cores: float
    response_bytes: int
    sample: str = ""
    first_error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # the server's CPU ms per request completed in the window (all kinds of a mix), by thread role (bench.machine)
    server_cpu_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Phase:
    """What one closed-loop phase saw."""

    lat_ms: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    sent: int = 0
    sample: bytes = b""
    first_error: str = ""
    response_bytes: int = 0


async def run_phase(senders: Sequence[Send], *, max_requests: int, max_seconds: float) -> Phase:
    """Each sender is one closed-loop client: it sends its next request when the last one answered."""
    (phase,) = await run_phases([senders], max_requests=max_requests, max_seconds=max_seconds)
    return phase


async def run_phases(groups: Sequence[Sequence[Send]], *, max_requests: int, max_seconds: float) -> list[Phase]:
    """One closed-loop phase over several groups of clients (one per payload), each group's own Phase.

    The request budget and the deadline are shared: `max_requests` counts the requests of all groups.
    """
    phases = [Phase() for _ in groups]
    deadline = time.perf_counter() + max_seconds
    sent = 0

    async def one_client(send: Send, phase: Phase) -> None:
        nonlocal sent
        while sent < max_requests and time.perf_counter() < deadline:
            sent += 1
            phase.sent += 1
            t0 = time.perf_counter()
            try:
                status, body = await send()
                elapsed = (time.perf_counter() - t0) * 1000.0
            except (httpx.HTTPError, WireError) as exc:  # count and go on: a benchmark reports failures
                key = type(exc).__name__
                phase.errors[key] = phase.errors.get(key, 0) + 1
                phase.first_error = phase.first_error or f"{key}: {exc}"
                continue
            if status == 200:
                phase.lat_ms.append(elapsed)
                if not phase.sample:
                    phase.sample = bytes(body[:200])
                    phase.response_bytes = len(body)
            else:
                key = f"HTTP {status}"
                phase.errors[key] = phase.errors.get(key, 0) + 1
                phase.first_error = phase.first_error or f"{key}: {bytes(body[:300]).decode('utf-8', 'replace')}"

    per_group = [[(send, phase) for send in senders] for senders, phase in zip(groups, phases, strict=True)]
    in_turn = [client for row in zip_longest(*per_group) for client in row if client is not None]  # round-robin
    await asyncio.gather(*(one_client(send, phase) for send, phase in in_turn))
    return phases


@asynccontextmanager
async def open_senders(
    client: Client, url: str, payload: Payload, concurrency: int, timeout_s: float
) -> AsyncIterator[list[Send]]:
    """`concurrency` senders of the prebuilt request, each on its own keep-alive connection."""
    if client == "httpx":
        async with new_client(concurrency, timeout_s) as http:

            async def post() -> tuple[int, bytes | memoryview]:
                response = await http.post(url, content=payload.content, headers=payload.headers)
                return response.status_code, response.content

            yield [post] * concurrency
        return
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = build_request(host, port, parts.path or "/", payload.headers, payload.content)
    connections = [Connection(host, port) for _ in range(concurrency)]

    def sender(conn: Connection) -> Send:
        async def send() -> tuple[int, bytes | memoryview]:
            try:
                async with asyncio.timeout(timeout_s):
                    answer = await conn.send(request)  # closes its connection when cancelled
            except TimeoutError as exc:
                raise WireError(f"no answer in {timeout_s} s") from exc
            return answer.status, answer.body

        return send

    try:
        yield [sender(c) for c in connections]
    finally:
        for conn in connections:
            await conn.close()


def bounded(url: str, concurrency: int, max_requests: int, max_seconds: float) -> tuple[int, float]:
    """Refuse non-loopback URLs and odd concurrency; clamp the budget to the hard caps."""
    check_loopback(url)
    if not 1 <= concurrency <= 256:
        raise ValueError("concurrency must be 1..256")
    return max(1, min(max_requests, HARD_MAX_REQUESTS)), min(max_seconds, HARD_MAX_SECONDS)


def new_client(concurrency: int, timeout_s: float) -> httpx.AsyncClient:
    """Keep-alive, one connection per client, and trust_env=False: never a proxy from the environment."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s), trust_env=False)


async def measure_async(
    base_url: str,
    payload: Payload,
    concurrency: int,
    *,
    max_requests: int = 2000,
    max_seconds: float = 15.0,
    warmup_requests: int | None = None,
    warmup_seconds: float = 10.0,
    server_pid: int | None = None,
    timeout_s: float = 120.0,
    counters: Callable[[], dict[str, float]] | None = None,
    client: Client = "wire",
) -> LoadResult:
    """Warm up, then measure one closed-loop point against `base_url + payload.path`.

    `counters` (e.g. the server's batch metrics) is read just before and after the measured
    phase; the differences land in `LoadResult.extra`.
    """
    mix = await measure_mix_async(
        base_url,
        [payload],
        concurrency,
        max_requests=max_requests,
        max_seconds=max_seconds,
        warmup_requests=warmup_requests,
        warmup_seconds=warmup_seconds,
        server_pid=server_pid,
        timeout_s=timeout_s,
        counters=counters,
        client=client,
    )
    (result,) = mix.parts
    return result


@dataclass
class MixResult:
    """One point of several payloads measured at once: one LoadResult per payload, all from the same window.

    Each part's `concurrency` is its own clients; its CPU fields are the whole window's (shared).
    """

    concurrency: int
    wall_s: float
    parts: list[LoadResult]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def completions(self) -> int:
        return sum(part.ok for part in self.parts)

    @property
    def other_cores(self) -> float:
        return self.parts[0].other_cores

    def shares(self) -> list[float]:
        """Each payload's fraction of all successful completions (NaN when none succeeded)."""
        total = self.completions
        return [part.ok / total if total else float("nan") for part in self.parts]

    def to_dict(self) -> dict[str, Any]:
        parts = [part.to_dict() | {"share": share} for part, share in zip(self.parts, self.shares(), strict=True)]
        return {
            "concurrency": self.concurrency,
            "wall_s": self.wall_s,
            "completions": self.completions,
            "other_cores": self.other_cores,
            "parts": parts,
            "extra": self.extra,
        }


def assign_clients(payloads: int, concurrency: int) -> list[int]:
    """How many clients each payload gets when client j sends payload j % payloads (round-robin)."""
    if payloads < 1 or concurrency < payloads:
        raise ValueError(f"{concurrency} clients cannot cover {payloads} payloads (each needs one at least)")
    return [len(range(i, concurrency, payloads)) for i in range(payloads)]


async def measure_mix_async(
    base_url: str,
    payloads: Sequence[Payload],
    concurrency: int,
    *,
    max_requests: int = 2000,
    max_seconds: float = 15.0,
    warmup_requests: int | None = None,
    warmup_seconds: float = 10.0,
    server_pid: int | None = None,
    timeout_s: float = 120.0,
    counters: Callable[[], dict[str, float]] | None = None,
    client: Client = "wire",
) -> MixResult:
    """Warm up, then measure `concurrency` closed-loop clients spread round-robin over `payloads` at once.

    The budget (`max_requests`, `max_seconds`) is shared; every payload is summarised on its own
    over the same window. `counters` differences land in `MixResult.extra` (and each part's `extra`).
    """
    shares = assign_clients(len(payloads), concurrency)
    urls = [base_url.rstrip("/") + p.path for p in payloads]
    for url in urls:
        max_requests, max_seconds = bounded(url, concurrency, max_requests, max_seconds)
    warm = max(3, 2 * concurrency) if warmup_requests is None else min(warmup_requests, HARD_MAX_REQUESTS)
    async with AsyncExitStack() as stack:
        groups = [
            await stack.enter_async_context(open_senders(client, url, payload, n, timeout_s))
            for url, payload, n in zip(urls, payloads, shares, strict=True)
        ]
        if warm > 0:
            await run_phases(groups, max_requests=warm, max_seconds=min(warmup_seconds, HARD_MAX_SECONDS))
        before = counters() if counters is not None else {}
        meter = CpuMeter([server_pid] if server_pid is not None else [])
        meter.start()
        phases = await run_phases(groups, max_requests=max_requests, max_seconds=max_seconds)
        cpu = meter.stop()
        after = counters() if counters is not None else {}
    server = cpu.watched_cores.get(server_pid, float("nan")) if server_pid is not None else float("nan")
    extra = {k: after[k] - before[k] for k in after if k in before}
    completed = sum(len(phase.lat_ms) for phase in phases)
    per_request = {role: 1000.0 * s / completed for role, s in cpu.roles_s.items()} if completed else {}
    parts = []
    for payload, n, phase in zip(payloads, shares, phases, strict=True):
        part = summarize(
            payload,
            n,
            phase,
            wall_s=cpu.wall_s,
            loadgen_cpu_s=cpu.self_cores * cpu.wall_s,
            machine_cores=cpu.machine_cores,
            server_cores=server,
        )
        part.extra = dict(extra)
        part.server_cpu_ms = dict(per_request)
        parts.append(part)
    return MixResult(concurrency, cpu.wall_s, parts, extra)


def summarize(
    payload: Payload,
    concurrency: int,
    phase: Phase,
    *,
    wall_s: float,
    loadgen_cpu_s: float,
    machine_cores: float,
    server_cores: float,
) -> LoadResult:
    """One point's numbers from what the clients saw and the CPU accounting of its window."""
    ok = len(phase.lat_ms)
    loadgen_cores = loadgen_cpu_s / wall_s
    server_known = 0.0 if math.isnan(server_cores) else server_cores  # NaN when not watched
    return LoadResult(
        name=payload.name,
        concurrency=concurrency,
        sent=phase.sent,
        ok=ok,
        errors=phase.errors,
        wall_s=wall_s,
        rps=ok / wall_s,
        images_per_s=ok * payload.images / wall_s,
        lat_ms=latency_summary(phase.lat_ms),
        loadgen_cores=loadgen_cores,
        loadgen_cpu_ms_per_req=loadgen_cpu_s * 1000.0 / phase.sent if phase.sent else float("nan"),
        machine_cores=machine_cores,
        server_cores=server_cores,
        other_cores=max(0.0, machine_cores - loadgen_cores - server_known),
        response_bytes=phase.response_bytes,
        sample=phase.sample[:200].decode("utf-8", "replace"),
        first_error=phase.first_error,
    )


def measure(base_url: str, payload: Payload, concurrency: int, **kwargs: Any) -> LoadResult:
    """Synchronous wrapper of `measure_async` (its own event loop)."""
    return asyncio.run(measure_async(base_url, payload, concurrency, **kwargs))


def measure_mix(base_url: str, payloads: Sequence[Payload], concurrency: int, **kwargs: Any) -> MixResult:
    """Synchronous wrapper of `measure_mix_async` (its own event loop)."""
    return asyncio.run(measure_mix_async(base_url, payloads, concurrency, **kwargs))


def format_result(r: LoadResult) -> str:
    lm = r.lat_ms
    errors = sum(r.errors.values())
    return (
        f"{r.name} c={r.concurrency:<3d} ok={r.ok:<5d} err={errors} img/s={r.images_per_s:7.2f} "
        f"p50={lm['p50']:7.1f} p95={lm['p95']:7.1f} p99={lm['p99']:7.1f} ms  "
        f"loadgen={r.loadgen_cores:.2f} cores ({r.loadgen_cpu_ms_per_req:.2f} ms CPU/req) "
        f"server={r.server_cores:.2f} other={r.other_cores:.2f} busy={r.machine_cores:.2f}"
        + (f"  server CPU ms/req: {format_roles(r.server_cpu_ms)}" if r.server_cpu_ms else "")
    )


def format_roles(ms: dict[str, float]) -> str:
    """`model 61.2, decode 5.0, event loop 2.1, other 0.4`: roles in a fixed order, then any others."""
    order = [role for role in ROLE_ORDER if role in ms] + sorted(set(ms) - set(ROLE_ORDER))
    return ", ".join(f"{role} {ms[role]:.1f}" for role in order)


def format_mix(r: MixResult) -> str:
    """One line per payload: completions, share, requests/s and latency, from the same window."""
    lines = [f"mix c={r.concurrency} completions={r.completions} wall={r.wall_s:.1f} s other={r.other_cores:.2f}"]
    for part, share in zip(r.parts, r.shares(), strict=True):
        lm = part.lat_ms
        lines.append(
            f"    {part.name} c={part.concurrency} ok={part.ok} share={share:.0%} rps={part.rps:.2f} "
            f"p50={lm['p50']:.1f} p99={lm['p99']:.1f} max={lm['max']:.1f} ms err={sum(part.errors.values())}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="full endpoint URL on loopback, e.g. http://127.0.0.1:8000/predict")
    ap.add_argument("--image", required=True, help="the image file each request carries")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument(
        "--form", choices=["multipart", "json"], default="multipart", help="multipart upload or base64 JSON"
    )
    ap.add_argument("-c", "--concurrency", type=int, default=1)
    ap.add_argument("--client", choices=CLIENTS, default="wire", help="HTTP client (default: wire)")
    ap.add_argument("--requests", type=int, default=2000, help="max measured requests")
    ap.add_argument("--duration", type=float, default=15.0, help="max measured seconds")
    ap.add_argument("--warmup-requests", type=int, default=None)
    ap.add_argument("--server-pid", type=int, default=None, help="also report this process's CPU")
    ap.add_argument("--json", default="", help="write the result here as JSON")
    args = ap.parse_args(argv)
    parts = urlsplit(args.url)
    base, path = f"{parts.scheme}://{parts.netloc}", parts.path or "/"
    with open(args.image, "rb") as f:
        data = f.read()
    if args.form == "multipart":
        payload = multipart_payload("cli", path, {"model": args.model}, [("image", data, "application/octet-stream")])
    else:
        payload = json_payload("cli", path, {"model": args.model, "inputs": [{"image": b64(data)}]})
    try:
        result = measure(
            base,
            payload,
            args.concurrency,
            max_requests=args.requests,
            max_seconds=args.duration,
            warmup_requests=args.warmup_requests,
            server_pid=args.server_pid,
            client=args.client,
        )
    except ValueError as exc:
        sys.exit(str(exc))
    print(format_result(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result.to_dict(), f, indent=2)


if __name__ == "__main__":
    main()
