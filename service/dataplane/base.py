"""What every part of the data plane shares: settings, the fleet, the decode pool, ready-model lookup,
and admission: a model-running request is decoded, costed and admitted before it is queued."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

from service.codecs.inputs import decode_batch
from service.config import Settings
from service.dataplane.costs import Estimate, check_answer
from service.dataplane.dry_run import DryRunAnswer, refusal, report
from service.dataplane.shapes import shapes_at
from service.dataplane.timing import Calibration, Work, check_time, estimate_time, plain_forwards, size_scale
from service.errors import DeadlineExceeded
from service.introspection.shapes import LayerShapes
from service.registry.loaded import LoadedModel
from service.runtime.admission import MemoryBudget
from service.runtime.allocator import MemoryReturner
from service.runtime.fleet import Fleet, ServedModel
from service.runtime.resident import resident_bytes
from service.runtime.runners.base import Runner
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
        self.calibration = Calibration()  # request times against their estimates, per model
        self.memory_returner = MemoryReturner(settings.memory_trim_after_bytes)
        self.budget = MemoryBudget(
            settings.memory_budget_bytes,
            settings.max_request_memory_bytes,
            settings.max_queue,
            on_release=self.memory_returner.freed,
            resident=resident_bytes,
        )

    def ready(self, name: str) -> ServedModel:
        """The ready model called `name` (404 unknown, 409 loading or failed)."""
        return self.fleet.ready(name)

    async def decode(
        self, items: Sequence[InputItem], images: Sequence[bytes] | None, model: LoadedModel
    ) -> torch.Tensor:
        """A request's inputs as one batch `[N, ...]`, decoded on the decode pool (never on the event loop)."""
        settings = self.settings
        return await self.off_loop(
            decode_batch, items, images, model, settings.max_image_pixels, settings.max_preprocessed_pixels
        )

    async def off_loop(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the decode pool: image decoding, request parsing, encoding of large answers."""
        return await asyncio.get_running_loop().run_in_executor(self.decode_pool, fn, *args)

    def seconds_per_row(self, model: LoadedModel, x: torch.Tensor, *, backward: bool) -> float:
        """One row's estimated seconds through `model` (with its backward when `backward`) at `x`'s sample size."""
        times = model.row_times
        per_row = times.forward + (times.backward if backward else 0.0)
        return per_row * size_scale(x, model.input_size) * self.calibration.factor(model.name)

    async def run_admitted(
        self,
        served: ServedModel,
        runner: Runner[Any],
        decoding: Awaitable[torch.Tensor],
        *,
        request: Any,
        estimate: Callable[[torch.Tensor, LayerShapes], Estimate],
        answer: tuple[str, str],
        work: Callable[[torch.Tensor], Work] = plain_forwards,
        request_for: Callable[[Estimate], Any] | None = None,
        dry_run: bool = False,
    ) -> tuple[torch.Tensor, Any]:
        """Decode, estimate the request's memory from the model's layer shapes and its time from the model's
        times per row, refuse it (413 for memory, 422 past its deadline) or wait for memory, then run it on the
        model's executor; returns the decoded inputs and the runner's answer.

        `answer` is (format, advice): the answer's format, for its size limits, and what to ask for instead.
        `request_for`, when given, makes the request from the estimate instead (its `rows_per_forward`, chosen to
        fit the memory limit); `work`: the rows the request pushes through the model, for its time estimate.
        A `dry_run` stops after the estimates: `DryRunAnswer` carries them, and nothing runs.
        The request stays announced to a forming batch of its kind until it is queued, unless it must
        wait for memory first.
        """
        fmt, advice = answer
        with served.executor.arriving(runner.name) as arrival:
            x = await decoding
            found = estimate(x, await shapes_at(served, tuple(int(s) for s in x.shape[1:]), self.decode_pool))
            model = served.model
            factor = self.calibration.factor(model.name)
            scale = size_scale(x, model.input_size) * factor
            timed = estimate_time(work(x), model.row_times, scale, served.executor.config.timeout_s)
            checks: list[Callable[[], None]] = [
                lambda: self.budget.check(found.cost, advice),
                lambda: check_answer(found, fmt, self.settings, advice),
                lambda: check_time(timed, model.row_times, scale),
            ]
            if dry_run:
                raise DryRunAnswer(report(model.name, found, timed, self.budget, refusal(checks)))
            for check in checks:
                check()
            job = request if request_for is None else request_for(found)
            async with self.budget.reserve(found.cost, advice, before_waiting=arrival.leave):
                start = time.perf_counter()
                try:
                    answer = await served.executor.submit(runner, x, job, arrival)
                except DeadlineExceeded:  # it took at least this long
                    self.calibration.observe(model.name, timed.seconds / factor, time.perf_counter() - start)
                    raise
                self.calibration.observe(model.name, timed.seconds / factor, time.perf_counter() - start)
                return x, answer
