"""How close a batched answer must be to the same request run alone."""

from __future__ import annotations

from typing import Any

import torch


def assert_same_predictions(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """The same classes in the same order, scores within 1e-5: one side may have run on the prediction path
    (ONNX Runtime, or BatchNorm folded), whose kernels sum in another order than the eager module's."""
    assert [[c["index"] for c in p["top_k"]] for p in got] == [[c["index"] for c in p["top_k"]] for p in want]
    assert [[c.get("label") for c in p["top_k"]] for p in got] == [[c.get("label") for c in p["top_k"]] for p in want]
    scores = [[[c["score"] for c in p["top_k"]] for p in side] for side in (got, want)]
    torch.testing.assert_close(torch.tensor(scores[0]), torch.tensor(scores[1]), rtol=1e-5, atol=1e-6)


def assert_batched_close(actual: torch.Tensor, expected: torch.Tensor, where: str = "") -> None:
    """Within 1e-6 of the tensor's own scale: a request batched with others runs matrix products of
    another size, whose accumulation order (and so the last bits of a sum of large terms) differs."""
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    torch.testing.assert_close(
        actual, expected, rtol=1e-6, atol=1e-6 * scale, msg=lambda message: f"{where}: {message}" if where else message
    )
