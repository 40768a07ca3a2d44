"""/predict on ONNX Runtime against the torch path, in alternating windows on two servers up at once.

The `default` server predicts on ONNX Runtime; a second one, the same settings with
`HOOKSERVE_ONNXRUNTIME=false`, on the BatchNorm-folded torch copy. Each point is measured on
both in turn (ABBA, as `bench.paired`), so the ratio carries none of the machine's drift.
Hooked requests run the same on both, so these ratios also convert issue 12's introspection
ratios from one prediction path to the other.

    .venv/bin/python -m bench.prediction_paths --into bench/RESULTS.json   # then: python -m bench.report
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.configs import DEFAULT, TORCH_PATH
from bench.loadgen import LoadResult, measure
from bench.paired import Log, Pair, Side, measure_pair
from bench.server import Server, free_port
from bench.workload import Inputs, Kind, build_payloads, make_inputs

NO_BOUND = float("nan")  # informative ratios: the report shows them, no target judges them
POINTS: tuple[Pair, ...] = (
    Pair("/predict JPEG, 32 clients: ONNX Runtime / torch path", Side(Kind.PREDICT_JPEG_MULTIPART, 32),
         Side(Kind.PREDICT_JPEG_MULTIPART, 32), "images_per_s", NO_BOUND, True),
    Pair("/predict JPEG, 8 clients: ONNX Runtime / torch path", Side(Kind.PREDICT_JPEG_MULTIPART, 8),
         Side(Kind.PREDICT_JPEG_MULTIPART, 8), "images_per_s", NO_BOUND, True),
    Pair("/predict tensor, 1 client p50: ONNX Runtime / torch path", Side(Kind.PREDICT_TENSOR, 1),
         Side(Kind.PREDICT_TENSOR, 1), "p50", NO_BOUND, False),
)  # fmt: skip


def measure_paths(
    inputs: Inputs,
    conv_layers: Callable[[str], list[str]],
    workdir: Path,
    log: Log,
    *,
    rounds: int = 4,
    window_s: float = 8.0,
    idle_wait_s: float = 120.0,
) -> list[dict[str, Any]]:
    """Each point in `rounds` ABBA rounds: top on the ONNX Runtime server, bottom on the torch-path one."""
    records: list[dict[str, Any]] = []
    with ExitStack() as stack:
        onnx = stack.enter_context(Server(replace(DEFAULT.config, name="onnxruntime"), free_port(), workdir))
        torch_path = stack.enter_context(Server(TORCH_PATH.config, free_port(), workdir))
        payloads = build_payloads(inputs, conv_layers(onnx.url))
        servers = {"top": onnx, "bottom": torch_path}

        def window(which: str, side: Side) -> LoadResult:
            server = servers[which]
            return measure(server.url, payloads[side.kind], side.clients, max_seconds=window_s, server_pid=server.pid)

        for pair in POINTS:
            record = measure_pair(pair, window, rounds, idle_wait_s, log)
            shown = ", ".join(f"{r['ratio']:.3f}" for r in record["rounds"])
            log(f"  {pair.name}: {shown}; median {record['ratio']:.3f}")
            records.append(record)
    return records


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--window", type=float, default=8.0, help="seconds of each window")
    ap.add_argument("--into", type=Path, default=None, help="add the records to this RESULTS.json")
    args = ap.parse_args(argv)
    from bench.run import conv_layers  # bench.run measures these too: imported here, not at its import

    with tempfile.TemporaryDirectory(prefix="hookserve-paths-") as tmp:
        log: Log = lambda line: print(line, flush=True)  # noqa: E731
        records = measure_paths(make_inputs(), conv_layers, Path(tmp), log, rounds=args.rounds, window_s=args.window)
    if args.into is not None:
        results = json.loads(args.into.read_text())
        results["prediction_paths"] = records
        args.into.write_text(json.dumps(results, indent=2) + "\n")
    else:
        json.dump(records, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
