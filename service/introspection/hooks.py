"""Request-scoped hooks: every hook in hookserve is registered through a `HookScope`.

The scope removes its handles in `finally` (also when the body raises), so a model's hook
dicts are empty between requests; `count_hooks` reports what is live, tensor hooks included.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from types import TracebackType

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")

_lock = threading.Lock()
_tensor_hooks: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()


def count_hooks(model: nn.Module) -> int:
    """Forward, forward-pre, backward and backward-pre hooks on every submodule, plus live tensor hooks.

    `_forward_hooks_with_kwargs` and friends only flag entries of the dicts counted here.
    """
    modules = sum(len(getattr(module, attr, {})) for module in model.modules() for attr in _HOOK_DICTS)
    with _lock:
        return modules + _tensor_hooks.get(model, 0)


class HookScope:
    """Owns the hooks registered for one job on `model` and removes all of them on exit.

    Usage: `with HookScope(model) as scope: scope.add(module.register_forward_hook(fn))`;
    tensor hooks go through `scope.tensor_hook(tensor, fn)` (or `scope.add(handle, tensor=True)`)
    so that `count_hooks(model)` sees them while the scope is open.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._handles: list[RemovableHandle] = []
        self._tensor_count = 0

    def add(self, handle: RemovableHandle, *, tensor: bool = False) -> RemovableHandle:
        """Take ownership of `handle` (removed when the scope exits); returns it."""
        self._handles.append(handle)
        if tensor:
            self._tensor_count += 1
            with _lock:
                _tensor_hooks[self.model] = _tensor_hooks.get(self.model, 0) + 1
        return handle

    def tensor_hook(self, tensor: Tensor, fn: Callable[[Tensor], Tensor | None]) -> RemovableHandle:
        """`tensor.register_hook(fn)`, owned and counted by this scope."""
        handle: RemovableHandle = tensor.register_hook(fn)  # type: ignore[no-untyped-call]
        return self.add(handle, tensor=True)

    def close(self) -> None:
        """Remove every handle (idempotent) and forget the tensor hooks counted for the model."""
        handles, self._handles = self._handles, []
        failure: Exception | None = None
        for handle in handles:  # one failing removal must not leave the others registered
            try:
                handle.remove()
            except Exception as exc:
                failure = failure or exc
        count, self._tensor_count = self._tensor_count, 0
        if count:
            with _lock:
                left = _tensor_hooks.get(self.model, 0) - count
                if left > 0:
                    _tensor_hooks[self.model] = left
                else:
                    _tensor_hooks.pop(self.model, None)
        if failure is not None:
            raise failure

    def __enter__(self) -> HookScope:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
