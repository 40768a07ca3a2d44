"""The prediction path's fused copy is traced beside served models without disturbing their forwards."""

from __future__ import annotations

import torch

from service.registry.fast_path import fused_copy
from service.registry.probes import Placement
from tests.unit.introspection.test_fx_tracing import Paused, forward_mid_trace


def test_folding_a_loading_model_leaves_other_threads_forwards_untouched() -> None:
    placement = Placement([4], torch.device("cpu"), torch.float32, False)

    def fold(module: torch.nn.Module) -> object:
        fused, reason = fused_copy(module, placement)
        assert fused is not None, reason
        return fused

    forward_mid_trace(fold)


def test_the_fused_copy_is_apart_from_the_model() -> None:
    model = Paused().eval()
    model.gate.release.set()
    fused, _ = fused_copy(model, Placement([4], torch.device("cpu"), torch.float32, False))
    assert fused is not None
    assert not any(a is b for a in fused.modules() for b in model.modules())
    assert "bn" not in dict(fused.named_modules())  # folded into fc
