"""FX tracing beside served models: one trace at a time in the process, other threads' modules left alone.

`torch.fx.Tracer.trace` patches `nn.Module.__call__` and `__getattr__` on the class, for every
thread, until it returns. A forward running on another thread meanwhile goes through the tracer
(and fails: "module is not installed as a submodule"), and two traces that overlap restore each
other's patches in the wrong order, which can leave `nn.Module.__call__` patched for good. So
every trace in hookserve holds `TRACING` and uses a `ThreadLocalTracing` tracer, which hands
other threads' module calls and attribute reads straight through.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from torch import fx, nn

TRACING = threading.Lock()


class ThreadLocalTracing(fx.Tracer):
    """A tracer that records only the calls of the thread running its `trace`; list it first among the bases."""

    _thread: int | None = None

    def trace(self, root: nn.Module | Callable[..., Any], concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        self._thread = threading.get_ident()
        try:
            return super().trace(root, concrete_args)
        finally:
            self._thread = None

    def call_module(
        self, m: nn.Module, forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if threading.get_ident() != self._thread:  # another thread's forward while FX's patch is in place
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if threading.get_ident() != self._thread:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)


def symbolic_trace(module: nn.Module) -> fx.GraphModule:
    """`torch.fx.symbolic_trace(module)`, safe beside forwards on other threads and other traces."""
    with TRACING:
        graph = ThreadLocalTracing().trace(module)
    return fx.GraphModule(module, graph, type(module).__name__)
