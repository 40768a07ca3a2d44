"""The closed-loop load generator split over several processes, for servers faster than one client core.

One asyncio process tops out at a few thousand small requests/s (far fewer with httpx);
a GPU server may need more. Each process warms up its own connections, then all start together.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.loadgen import Client, LoadResult, Phase, bounded, open_senders, run_phase, summarize
from bench.machine import run_side_by_side
from bench.payloads import Payload


def _client_process(
    url: str,
    payload: Payload,
    *,
    clients: int,
    max_requests: int,
    max_seconds: float,
    client: Client,
    barrier: Any,
    out: Any,
) -> None:
    async def go() -> tuple[Phase, float, float]:
        async with open_senders(client, url, payload, clients, 120.0) as senders:
            await run_phase(senders, max_requests=max(3, 2 * clients), max_seconds=30.0)
            barrier.wait()  # blocking on purpose: nothing else runs on this loop meanwhile
            t0, cpu0 = time.perf_counter(), time.process_time()
            phase = await run_phase(senders, max_requests=max_requests, max_seconds=max_seconds)
            return phase, time.perf_counter() - t0, time.process_time() - cpu0

    out.put(asyncio.run(go()))


def measure_processes(
    base_url: str,
    payload: Payload,
    concurrency: int,
    processes: int,
    *,
    max_requests: int = 20_000,
    max_seconds: float = 15.0,
    server_pid: int | None = None,
    client: Client = "wire",
) -> LoadResult:
    """`concurrency` clients spread over `processes` processes; one merged result, CPU of all of them counted."""
    url = base_url.rstrip("/") + payload.path
    max_requests, max_seconds = bounded(url, concurrency, max_requests, max_seconds)
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    budget = max(1, max_requests // processes)
    kwargs: dict[str, Any] = {"max_requests": budget, "max_seconds": max_seconds, "client": client}
    parts, cpu = run_side_by_side(
        _client_process,
        [((url, payload), {"clients": n, **kwargs}) for n in shares],
        watch=[server_pid] if server_pid is not None else [],
        start_timeout=120,
        result_timeout=max_seconds + 180,
    )
    merged = Phase()
    for phase, _, _ in parts:
        merged.lat_ms += phase.lat_ms
        merged.sent += phase.sent
        for key, n in phase.errors.items():
            merged.errors[key] = merged.errors.get(key, 0) + n
        merged.sample = merged.sample or phase.sample
        merged.response_bytes = merged.response_bytes or phase.response_bytes
        merged.first_error = merged.first_error or phase.first_error
    wall = max(w for _, w, _ in parts)
    server = cpu.watched_cores.get(server_pid, float("nan")) if server_pid is not None else float("nan")
    return summarize(
        payload,
        concurrency,
        merged,
        wall_s=wall,
        loadgen_cpu_s=sum(c for _, _, c in parts),
        machine_cores=cpu.machine_cores,
        server_cores=server,
    )
