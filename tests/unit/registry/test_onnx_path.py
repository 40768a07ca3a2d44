"""The ONNX Runtime path: its sessions' threads, and a fallback apart from the module hooks are registered on."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import nn

from service.registry import onnx_path
from service.registry.onnx_path import OnnxRuntimeModule, onnxruntime_copy
from service.registry.probes import Placement
from service.runtime.threads import pin_torch_threads

PLACEMENT = Placement([3, 8, 8], torch.device("cpu"), torch.float32, False)


def small() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2)
    ).eval()


def runtime_of(module: nn.Module, wide_threads: int = 2) -> OnnxRuntimeModule:
    runtime, reason = onnxruntime_copy(module, PLACEMENT, None, wide_threads)
    assert isinstance(runtime, OnnxRuntimeModule), reason
    return runtime


def on_thread(threads: int, fn: Any) -> None:
    def body() -> None:
        pin_torch_threads(threads)
        fn()

    worker = threading.Thread(target=body)
    worker.start()
    worker.join()


def test_a_thread_with_several_intra_op_threads_takes_the_wide_session(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = runtime_of(small())
    used: list[object] = []
    real = OnnxRuntimeModule.run

    def spy(session: Any, x: torch.Tensor) -> torch.Tensor:
        used.append(session)
        return real(session, x)

    monkeypatch.setattr(onnx_path.OnnxRuntimeModule, "run", staticmethod(spy))
    x = PLACEMENT.probe(2)
    on_thread(2, lambda: runtime(x))
    on_thread(1, lambda: runtime(x))
    assert runtime.wide is not None
    assert used == [runtime.wide, runtime.narrow]


def test_one_thread_servers_build_no_wide_session() -> None:
    assert runtime_of(small(), wide_threads=1).wide is None


def test_other_inputs_run_on_a_copy_that_hooks_on_the_model_never_see() -> None:
    module = small()
    runtime = runtime_of(module)
    fired: list[str] = []
    for name, child in module.named_children():
        child.register_forward_hook(lambda *_, name=name: fired.append(name))
    x = torch.randn(1, 3, 8, 8, dtype=torch.float64)  # not the exported dtype: the fallback runs it
    assert not runtime.accepts(x)
    runtime(x.float()), runtime(x.float()[:, :, :, :7])  # the runtime, then the fallback (another shape)
    assert fired == []
    assert not any(a is b for a in runtime.modules() for b in module.modules())


def test_a_model_on_another_dtype_keeps_the_torch_path() -> None:
    placement = Placement([3, 8, 8], torch.device("cpu"), torch.bfloat16, False)
    runtime, reason = onnxruntime_copy(small().to(torch.bfloat16), placement, None, 1)
    assert runtime is None
    assert reason == "it runs in bfloat16"


def test_models_loading_side_by_side_export_one_at_a_time() -> None:
    """The TorchScript exporter's state is process-wide: concurrent exports would fail each other."""
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def load() -> None:
        start.wait()
        for _ in range(3):
            try:
                runtime_of(small())
            except BaseException as exc:  # an AssertionError carrying the reason
                errors.append(exc)

    workers = [threading.Thread(target=load) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
