"""Captum's notice that it sets hooks on activations, silenced where hookserve calls those methods.

Guided backprop, deconvolution and DeepLift warn on every call that they set (and will remove)
hooks on ReLUs and other non-linearities. Captum removes them in `finally` and `GET /models`
reports `hooks: 0` after every request, so the notice says nothing a client can act on; any other
warning still goes through.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

_HOOK_NOTICES = r"Setting (backward hooks on ReLU activations|forward, backward hooks and attributes on non-linear)"


@contextmanager
def hook_notices_off() -> Iterator[None]:
    """Ignore Captum's hook-setting UserWarnings inside the block (only those)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_HOOK_NOTICES, category=UserWarning)
        yield
