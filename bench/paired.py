"""Issue 12's ratios measured in alternating windows, so that both sides of a ratio meet the same machine.

The points of `bench.run` are measured one after another, minutes apart; on a shared 2-core machine
whose speed drifts by 10-15 % over minutes, a ratio of two such points carries that drift. Here each
ratio's two sides are measured in turn, `rounds` times, in ABBA order (top then bottom, then bottom
then top, ...), each window `window_s` long after its own warm-up; a round's ratio divides its two
windows, and the ratio reported is the median of the rounds, with every round kept in RESULTS.json.
The before/after ratio runs today's main from a worktree as a second server, up at the same time
and idle while the other is measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from bench import baseline as main_before
from bench.configs import DEFAULT
from bench.loadgen import Client, LoadResult, measure
from bench.machine import wait_idle
from bench.report import BEFORE_AFTER, BEFORE_AFTER_NAME, GRADCAM_P50, GRADCAM_P50_NAME, INTROSPECTION_RATIOS
from bench.server import Server, free_port
from bench.workload import Inputs, Kind, build_payloads

Stat = Literal["images_per_s", "p50"]
Log = Callable[[str], None]


@dataclass(frozen=True)
class Side:
    """One side of a ratio: a kind of request at a number of clients, on this commit or on today's main."""

    kind: Kind
    clients: int
    before: bool = False  # on the server running today's main

    def text(self) -> str:
        where = " on today's main" if self.before else ""
        return f"{self.kind.value} x{self.clients}{where}"


@dataclass(frozen=True)
class Pair:
    """A ratio target: `stat` of `top` over `stat` of `bottom`, at least (or at most) `bound`."""

    name: str  # the name the target has in bench.report
    top: Side
    bottom: Side
    stat: Stat
    bound: float
    higher_is_better: bool


CPU_CLIENTS = 8  # the CPU ratios of INTROSPECTION_RATIOS (its 64-client one is the GPU's, bench/gpu.py)

# issue 12's ratio targets as bench.report names and bounds them, so that a paired median replaces its twin
ISSUE_12_PAIRS: tuple[Pair, ...] = (
    *(
        Pair(name, Side(Kind(kind), clients), Side(Kind.PREDICT_JPEG_MULTIPART, clients), "images_per_s", bound, True)
        for kind, clients, bound, name in INTROSPECTION_RATIOS
        if clients == CPU_CLIENTS
    ),
    Pair(GRADCAM_P50_NAME, Side(Kind.SALIENCY_GRADCAM, 1), Side(Kind.PREDICT_TENSOR, 1), "p50", GRADCAM_P50, False),
    Pair(
        f"{BEFORE_AFTER_NAME} in the same run",
        Side(Kind.PREDICT_JPEG_MULTIPART, 32),
        Side(Kind.PREDICT_JPEG_MULTIPART, 32, before=True),
        "images_per_s",
        BEFORE_AFTER,
        True,
    ),
)


def stat_of(result: LoadResult, stat: Stat) -> float:
    """images/s or p50 latency (ms) of one window."""
    return result.images_per_s if stat == "images_per_s" else result.lat_ms["p50"]


def ratio(top: float, bottom: float) -> float:
    return top / bottom if bottom > 0 else float("nan")


def order(round_index: int) -> tuple[str, str]:
    """ABBA: even rounds measure the top side first, odd rounds the bottom side first."""
    return ("top", "bottom") if round_index % 2 == 0 else ("bottom", "top")


def summarize(pair: Pair, rounds: list[dict[str, LoadResult]]) -> dict[str, Any]:
    """The record RESULTS.json keeps: the pair, each round's windows and ratio, and the median ratio."""
    kept: list[dict[str, Any]] = []
    for windows in rounds:
        top, bottom = stat_of(windows["top"], pair.stat), stat_of(windows["bottom"], pair.stat)
        kept.append(
            {
                "top": top,
                "bottom": bottom,
                "ratio": ratio(top, bottom),
                "errors": sum(sum(w.errors.values()) for w in windows.values()),
                "first": order(len(kept))[0],
            }
        )
    ratios = [float(r["ratio"]) for r in kept]
    return {
        "name": pair.name,
        "top": asdict(pair.top),
        "bottom": asdict(pair.bottom),
        "stat": pair.stat,
        "bound": pair.bound,
        "higher_is_better": pair.higher_is_better,
        "rounds": kept,
        "ratio": statistics.median(ratios) if ratios else float("nan"),
    }


@contextmanager
def _servers(workdir: Path, baseline_ref: str | None, log: Log) -> Iterator[dict[bool, Server]]:
    """This commit's `default` server and, with `baseline_ref`, today's main's beside it (key: before?)."""
    with ExitStack() as stack:
        servers = {False: stack.enter_context(Server(replace(DEFAULT.config, name="paired"), free_port(), workdir))}
        if baseline_ref is not None:
            before = stack.enter_context(main_before.checkout(baseline_ref, workdir / "paired-baseline"))
            cfg = replace(DEFAULT.config, name=f"paired@{before.short}")
            log(f"paired windows: today's main {before.ref} ({before.commit}) beside this commit")
            servers[True] = stack.enter_context(Server(cfg, free_port(), workdir, source=before.path))
        yield servers


def measure_pairs(
    inputs: Inputs,
    conv_layers: Callable[[str], list[str]],
    workdir: Path,
    log: Log,
    *,
    pairs: tuple[Pair, ...] = ISSUE_12_PAIRS,
    rounds: int = 5,
    window_s: float = 8.0,
    idle_wait_s: float = 120.0,
    baseline_ref: str | None = None,
    client: Client = "wire",
) -> list[dict[str, Any]]:
    """Every pair in `rounds` ABBA rounds; pairs needing today's main are left out without `baseline_ref`."""
    wanted = [p for p in pairs if baseline_ref is not None or not (p.top.before or p.bottom.before)]
    records: list[dict[str, Any]] = []
    with _servers(workdir, baseline_ref, log) as servers:
        payloads = build_payloads(inputs, conv_layers(servers[False].url))

        def window(which: str, side: Side) -> LoadResult:
            server = servers[side.before]
            return measure(
                server.url,
                payloads[side.kind],
                side.clients,
                max_seconds=window_s,
                server_pid=server.pid,
                client=client,
            )

        for pair in wanted:
            record = measure_pair(pair, window, rounds, idle_wait_s, log)
            shown = ", ".join(f"{r['ratio']:.3f}" for r in record["rounds"])
            median = record["ratio"]
            log(f"  paired {pair.top.text()} / {pair.bottom.text()} ({pair.stat}): {shown}; median {median:.3f}")
            records.append(record)
    return records


def measure_pair(
    pair: Pair, window: Callable[[str, Side], LoadResult], rounds: int, idle_wait_s: float, log: Log
) -> dict[str, Any]:
    """One pair in `rounds` ABBA rounds once the machine is idle; `window(which, side)` measures its `top` or
    `bottom` side. The record `summarize` makes of them."""
    wait_idle(idle_wait_s, log=log)
    done: list[dict[str, LoadResult]] = []
    for index in range(rounds):
        done.append({which: window(which, getattr(pair, which)) for which in order(index)})
    return summarize(pair, done)
