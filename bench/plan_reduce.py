"""A capture's `mean` inside the exported graph against the same mean in torch after ONNX Runtime hands the maps over.

resnet18 (seeded random weights) with the outputs of `conv1`, `layer1.0.conv1` and `layer4` as extra graph outputs,
exported twice: once returning the maps (reduced in torch afterwards, as a plan without an in-graph reduction
does), once with the mean inside the graph. Batches of 8 at 224 x 224, one ONNX Runtime session of 2 threads each,
in alternating rounds (ABBA) of 10 batches; the answers are compared first.

    .venv/bin/python -m bench.plan_reduce          # ~1 min
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torchvision.models import resnet18
from torchvision.models.feature_extraction import create_feature_extractor

from bench.machine import machine_info
from service.registry.onnx_path import INPUT, export, inference_session

NODES = ("conv1", "layer1.0.conv1", "layer4")
NAMES = [f"capture{i}" for i in range(len(NODES))]


class Captures(nn.Module):
    """The chosen layers' outputs, as maps or averaged over their spatial dims."""

    def __init__(self, model: nn.Module, inside: bool) -> None:
        super().__init__()
        self.body = create_feature_extractor(model, {node: node for node in NODES})
        self.inside = inside

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        found = self.body(x)
        maps = [found[node] for node in NODES]
        return tuple(m.mean(dim=(2, 3)) for m in maps) if self.inside else tuple(maps)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plan_reduce", description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batches", type=int, default=10, help="batches per round and side")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = resnet18().eval()
    x = torch.randn(8, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    sessions: dict[str, Any] = {
        side: inference_session(export(Captures(model, side == "inside"), x, NAMES), 2) for side in ("after", "inside")
    }

    def run(side: str) -> list[Tensor]:
        arrays = sessions[side].run(NAMES, {INPUT: x.numpy()})
        found = [torch.from_numpy(a) for a in arrays]
        return [t.mean(dim=(2, 3)) for t in found] if side == "after" else found

    difference = max(float((a - b).abs().max()) for a, b in zip(run("after"), run("inside"), strict=True))
    seconds: dict[str, list[float]] = {"after": [], "inside": []}
    for r in range(args.rounds):
        for side in ("after", "inside") if r % 2 == 0 else ("inside", "after"):
            started = time.perf_counter()
            for _ in range(args.batches):
                run(side)
            seconds[side].append((time.perf_counter() - started) / args.batches)
    median = {side: statistics.median(times) for side, times in seconds.items()}
    print(f"machine: {machine_info()}")
    print(f"largest difference between the two answers: {difference:.2e}")
    for side, times in seconds.items():
        print(
            f"mean {side} the graph: {median[side] * 1000:.1f} ms per batch of 8 (rounds: "
            f"{', '.join(f'{t * 1000:.1f}' for t in times)})"
        )
    print(f"inside / after: {median['inside'] / median['after']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
