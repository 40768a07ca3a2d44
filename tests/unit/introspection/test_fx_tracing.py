"""FX traces beside served models: other threads' forwards run untouched, and traces never overlap."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from torch import Tensor, fx, nn

from service.introspection.fx_tracing import symbolic_trace
from service.zoo.lenet import load_lenet

ORIGINAL_CALL = nn.Module.__call__


class Gate:
    """Events a Paused model's forward signals and waits on; kept outside the module so that copies share them."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()


GATES: dict[int, Gate] = {}


class Paused(nn.Module):
    """Linear + BatchNorm (so the fast path folds it) whose forward blocks, mid-trace, until released."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.gate_id = len(GATES)
        GATES[self.gate_id] = Gate()

    @property
    def gate(self) -> Gate:
        return GATES[self.gate_id]

    def forward(self, x: Tensor) -> Tensor:
        self.gate.entered.set()
        assert self.gate.release.wait(30)
        out: Tensor = self.bn(self.fc(x))
        return out


def test_symbolic_trace_gives_torchs_graph() -> None:
    model = load_lenet()
    assert symbolic_trace(model).code == fx.symbolic_trace(model).code
    assert type(symbolic_trace(model)).__name__ == type(fx.symbolic_trace(model)).__name__ == "LeNet"


class Scaled(nn.Module):
    """A parameter read in the module's own forward: FX gives it a get_attr node (through the tracer's getattr)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.full((4,), 2.0))

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc(x) * self.scale
        return out


def test_a_parameter_read_in_forward_is_traced_as_torch_traces_it() -> None:
    model = Scaled()
    traced = symbolic_trace(model)
    assert traced.code == fx.symbolic_trace(model).code
    assert "scale" in [node.target for node in traced.graph.nodes if node.op == "get_attr"]


def forward_mid_trace(trace: Callable[[nn.Module], object]) -> None:
    """Run lenet on this thread while `trace` is inside a Paused model's trace on another; it must be untouched."""
    lenet = load_lenet()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        want = lenet(x)
    paused = Paused().eval()
    done: list[object] = []
    tracing = threading.Thread(target=lambda: done.append(trace(paused)))
    tracing.start()
    try:
        assert paused.gate.entered.wait(30)
        with torch.inference_mode():
            got = lenet(x)  # FX's patch of nn.Module is in place now
    finally:
        paused.gate.release.set()
        tracing.join(30)
    assert torch.equal(got, want)
    assert done
    assert nn.Module.__call__ is ORIGINAL_CALL


def test_forwards_on_other_threads_run_untouched_mid_trace() -> None:
    forward_mid_trace(symbolic_trace)


def test_traces_wait_for_each_other() -> None:
    first, second = Paused().eval(), Paused().eval()
    second.gate.release.set()
    threads = [threading.Thread(target=symbolic_trace, args=(m,)) for m in (first, second)]
    threads[0].start()
    assert first.gate.entered.wait(30)
    threads[1].start()
    try:
        assert not second.gate.entered.wait(0.3)  # the second trace has not begun
    finally:
        first.gate.release.set()
        for thread in threads:
            thread.join(30)
    assert second.gate.entered.is_set()
    assert nn.Module.__call__ is ORIGINAL_CALL
