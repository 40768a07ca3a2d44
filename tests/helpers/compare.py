"""How close a batched answer must be to the same request run alone."""

from __future__ import annotations

import torch


def assert_batched_close(actual: torch.Tensor, expected: torch.Tensor, where: str = "") -> None:
    """Within 1e-6 of the tensor's own scale: a request batched with others runs matrix products of
    another size, whose accumulation order (and so the last bits of a sum of large terms) differs."""
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    torch.testing.assert_close(
        actual, expected, rtol=1e-6, atol=1e-6 * scale, msg=lambda message: f"{where}: {message}" if where else message
    )
