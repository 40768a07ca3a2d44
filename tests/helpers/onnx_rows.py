"""Rows that reach ONNX Runtime's prediction path, counted by a spy on `OnnxRuntimeModule.run`."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from service.registry import onnx_path


def count_onnx_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The batch size of every forward that reaches ONNX Runtime from now on (in this test)."""
    seen: list[int] = []
    real = onnx_path.OnnxRuntimeModule.run

    def spy(session: Any, x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[0])
        return real(session, x)

    monkeypatch.setattr(onnx_path.OnnxRuntimeModule, "run", staticmethod(spy))
    return seen
