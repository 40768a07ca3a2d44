"""What every part of the data plane shares: settings, the fleet, the decode pool, ready-model lookup."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from service.codecs.inputs import decode_batch
from service.config import Settings
from service.registry.loaded import LoadedModel
from service.runtime.fleet import Fleet, ServedModel
from service.runtime.runners.saliency import SaliencyRunner
from service.schemas.common import InputItem

T = TypeVar("T")


class PlaneBase:
    """Holds what the data plane's parts use; `DataPlane` combines the parts."""

    def __init__(self, settings: Settings, fleet: Fleet, decode_pool: ThreadPoolExecutor) -> None:
        self.settings = settings
        self.fleet = fleet
        self.decode_pool = decode_pool
        self.saliency_runner = SaliencyRunner(settings)

    def ready(self, name: str) -> ServedModel:
        """The ready model called `name` (404 unknown, 409 loading or failed)."""
        return self.fleet.ready(name)

    async def decode(
        self, items: Sequence[InputItem], images: Sequence[bytes] | None, model: LoadedModel
    ) -> torch.Tensor:
        """A request's inputs as one batch `[N, ...]`, decoded on the decode pool (never on the event loop)."""
        return await self.off_loop(decode_batch, items, images, model, self.settings.max_image_pixels)

    async def off_loop(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the decode pool: image decoding, request parsing, encoding of large answers."""
        return await asyncio.get_running_loop().run_in_executor(self.decode_pool, fn, *args)
