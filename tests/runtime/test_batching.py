"""Dynamic batching on a ModelExecutor: announced concurrent requests share one forward, split back exactly."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from service.errors import InvalidField
from service.registry.loaded import LoadedModel
from service.runtime.executor import ExecutorConfig, ModelExecutor
from service.runtime.threads import ThreadBudget
from tests.helpers.loaded import loaded_model

LONG_DELAY_MS = 60_000.0  # a batch that waited this long would make the test fail, not pass
# Timed on purpose: "flushed without waiting out the delay" is a statement about time. A batch that
# waited would take 60 s; anything under half of that did not wait, however busy the machine.
NOT_WAITED_S = LONG_DELAY_MS / 1000 / 2


class Recorder(nn.Module):
    """y = W x + b with hand-set integers (exact in float32); remembers every batch size it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [0, 2, 0, 0], [1, 1, 1, 1]]))
            self.fc.bias.copy_(torch.tensor([0.0, 1, -1]))
        self.batch_sizes: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(int(x.shape[0]))
        return self.fc(x)  # type: ignore[no-any-return]


def expected(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return torch.stack([x[:, 0], 2 * x[:, 1] + 1, x.sum(1) - 1], dim=1)


def loaded(module: Recorder) -> LoadedModel:
    return loaded_model(module, [4], name="rec", num_classes=3)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def make_executor(recorder: Recorder) -> Iterator[Any]:
    executors: list[ModelExecutor] = []

    def factory(**config: Any) -> ModelExecutor:
        executor = ModelExecutor(loaded(recorder), ExecutorConfig(**{"threads": 1, **config}))
        executors.append(executor)
        return executor

    yield factory
    for executor in executors:
        executor.stop(5.0)


def samples(n: int, rows: int = 1, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.arange(rows * 4, dtype=dtype).reshape(rows, 4) + 10 * i for i in range(n)]


async def decoded(x: torch.Tensor) -> torch.Tensor:
    """A request's decoding: it yields to the event loop once, as decoding on a thread pool does."""
    await asyncio.sleep(0)
    return x


async def submit_announced(executor: ModelExecutor, inputs: list[torch.Tensor]) -> list[Any]:
    """What the data plane does: each request is announced while it decodes, queued once decoded."""
    return await asyncio.gather(*(executor.predict(decoded(x)) for x in inputs))


def test_announced_concurrent_requests_share_one_batch(make_executor: Any, recorder: Recorder) -> None:
    executor = make_executor(max_batch_size=8, max_batch_delay_ms=LONG_DELAY_MS)
    inputs = samples(5)
    started = time.perf_counter()
    outputs = asyncio.run(submit_announced(executor, inputs))
    assert time.perf_counter() - started < NOT_WAITED_S  # flushed when nothing more was coming
    assert recorder.batch_sizes == [5]
    assert (executor.stats.batches, executor.stats.batched_samples) == (1, 5)
    for x, out in zip(inputs, outputs, strict=True):
        assert out.shape == (1, 3)
        assert torch.equal(out, expected(x))


def test_batches_flush_at_max_batch_size(make_executor: Any, recorder: Recorder) -> None:
    executor = make_executor(max_batch_size=4, max_batch_delay_ms=LONG_DELAY_MS)
    inputs = samples(10)
    outputs = asyncio.run(submit_announced(executor, inputs))
    assert recorder.batch_sizes == [4, 4, 2]
    assert (executor.stats.batches, executor.stats.batched_samples) == (3, 10)
    assert all(torch.equal(out, expected(x)) for x, out in zip(inputs, outputs, strict=True))


def test_multi_sample_requests_are_never_split(make_executor: Any, recorder: Recorder) -> None:
    executor = make_executor(max_batch_size=4, max_batch_delay_ms=LONG_DELAY_MS)
    inputs = samples(3, rows=3)  # 3 + 3 > 4: each request is its own batch
    outputs = asyncio.run(submit_announced(executor, inputs))
    assert recorder.batch_sizes == [3, 3, 3]
    assert all(torch.equal(out, expected(x)) for x, out in zip(inputs, outputs, strict=True))


def test_different_dtypes_are_batched_apart(make_executor: Any, recorder: Recorder) -> None:
    executor = make_executor(max_batch_size=8, max_batch_delay_ms=LONG_DELAY_MS)
    inputs = [*samples(2), *samples(2, dtype=torch.float16)]
    inputs = [inputs[0], inputs[2], inputs[1], inputs[3]]  # interleaved: float32, float16, float32, float16
    outputs = asyncio.run(submit_announced(executor, inputs))
    assert recorder.batch_sizes == [2, 2]
    assert executor.stats.batches == 2
    assert all(torch.equal(out, expected(x)) for x, out in zip(inputs, outputs, strict=True))


def test_unannounced_sequential_requests_run_alone(make_executor: Any, recorder: Recorder) -> None:
    executor = make_executor(max_batch_size=8, max_batch_delay_ms=LONG_DELAY_MS)

    async def one_by_one() -> None:
        for x in samples(3):
            assert torch.equal(await executor.predict(x), expected(x))

    asyncio.run(one_by_one())
    assert recorder.batch_sizes == [1, 1, 1]


def test_a_request_that_never_comes_costs_at_most_the_delay(make_executor: Any, recorder: Recorder) -> None:
    delay_ms = 200.0
    executor = make_executor(max_batch_size=8, max_batch_delay_ms=delay_ms)

    async def fails_late() -> torch.Tensor:
        await asyncio.sleep(LONG_DELAY_MS / 1000 / 4)  # this one's decode fails, long after the delay
        raise InvalidField("undecodable")

    async def one_of_two() -> tuple[Any, float]:
        started = time.perf_counter()
        late = asyncio.ensure_future(executor.predict(fails_late()))
        result = await executor.predict(decoded(samples(1)[0]))
        elapsed = time.perf_counter() - started
        late.cancel()
        return result, elapsed

    result, elapsed = asyncio.run(one_of_two())
    assert torch.equal(result, expected(samples(1)[0]))
    # Timed on purpose (the delay is the subject): at least the delay (a lower bound holds on any machine),
    # and far less than forever (the withdrawn request never arrives).
    assert elapsed >= delay_ms / 1000 * 0.9
    assert elapsed < NOT_WAITED_S
    assert recorder.batch_sizes == [1]


def test_post_runs_per_request_and_its_failure_stays_there(make_executor: Any, recorder: Recorder) -> None:
    executor = make_executor(max_batch_size=8, max_batch_delay_ms=LONG_DELAY_MS)

    def ok(out: torch.Tensor) -> float:
        return float(out.sum())

    def bad(out: torch.Tensor) -> float:
        raise InvalidField("not for this one")

    async def run() -> list[Any]:
        inputs = samples(3)
        posts = [ok, bad, ok]
        return await asyncio.gather(
            *(executor.predict(decoded(x), p) for x, p in zip(inputs, posts, strict=True)),
            return_exceptions=True,
        )

    first, second, third = asyncio.run(run())
    assert recorder.batch_sizes == [3]
    assert first == float(expected(samples(3)[0]).sum())
    assert isinstance(second, InvalidField)
    assert third == float(expected(samples(3)[2]).sum())


def test_a_shape_the_model_cannot_take_is_the_clients_422(make_executor: Any) -> None:
    executor = make_executor()
    with pytest.raises(InvalidField, match=r"rec cannot run on samples of shape \[5\] \(its input size is \[4\]\)"):
        asyncio.run(executor.predict(torch.zeros(1, 5)))


class Where(nn.Module):
    """Remembers the thread each forward ran on and its intra-op thread count; fails on a row of -1s."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.seen: list[tuple[str, int]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((threading.current_thread().name, torch.get_num_threads()))
        if bool((x == -1).all()):
            raise RuntimeError("a row of -1s")
        return self.fc(x)  # type: ignore[no-any-return]


def test_a_cpu_model_alone_runs_wide_within_the_budget_it_is_given() -> None:
    module = Where()
    budget = ThreadBudget(total=2, max_per_job=2)
    executor = ModelExecutor(
        loaded_model(module, [4], name="where", num_classes=3), ExecutorConfig(threads=1), None, budget
    )
    try:
        asyncio.run(executor.predict(torch.zeros(1, 4)))
    finally:
        executor.stop(5.0)
        budget.close()
    assert module.seen == [("hookserve-wide", 2)]


def test_an_unexpected_error_is_logged_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    module = Where()
    executor = ModelExecutor(loaded_model(module, [4], name="where", num_classes=3), ExecutorConfig(threads=1))
    try:
        with caplog.at_level(logging.ERROR, logger="hookserve.executor"), pytest.raises(RuntimeError, match="-1s"):
            asyncio.run(executor.predict(torch.full((1, 4), -1.0)))
    finally:
        executor.stop(5.0)
    [record] = [r for r in caplog.records if r.name == "hookserve.executor"]
    assert record.getMessage() == "job on where failed"
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "a row of -1s"


class FailsOnAnyMinusOneRow(nn.Module):
    """y = W x + b as Recorder, but a batch holding any row of -1s fails as a whole; remembers batch sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Recorder()
        self.batch_sizes: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(int(x.shape[0]))
        if bool((x == -1).all(dim=1).any()):
            raise RuntimeError("a row of -1s")
        return self.inner(x)  # type: ignore[no-any-return]


def test_a_batch_that_fails_as_a_whole_is_rerun_request_by_request(caplog: pytest.LogCaptureFixture) -> None:
    """One request's bad row fails the batched forward: each request is then run alone, so the others still get
    their answers, the bad one its own error, and a request whose post fails its own error too."""
    module = FailsOnAnyMinusOneRow()
    executor = ModelExecutor(
        loaded_model(module, [4], name="alone", num_classes=3),
        ExecutorConfig(threads=1, max_batch_size=8, max_batch_delay_ms=LONG_DELAY_MS),
    )
    good, bad, other = samples(1)[0], torch.full((1, 4), -1.0), samples(2)[1]

    def broken_post(out: torch.Tensor) -> float:
        raise ValueError("post went wrong")

    async def run() -> list[Any]:
        sends = [
            executor.predict(decoded(good)),
            executor.predict(decoded(bad)),
            executor.predict(decoded(other), broken_post),
        ]
        return await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), timeout=60)

    try:
        with caplog.at_level(logging.ERROR, logger="hookserve.executor"):
            first, second, third = asyncio.run(run())
    finally:
        executor.stop(5.0)
    assert module.batch_sizes == [3, 1, 1, 1]  # the batch of 3 failed, then each request alone
    assert module.inner.batch_sizes == [1, 1]
    assert isinstance(first, torch.Tensor)
    assert torch.equal(first, expected(good))
    assert isinstance(second, RuntimeError)
    assert str(second) == "a row of -1s"
    assert isinstance(third, ValueError)
    assert str(third) == "post went wrong"
    logged = {str(r.exc_info[1]) for r in caplog.records if r.name == "hookserve.executor" and r.exc_info}
    assert logged == {"a row of -1s", "post went wrong"}


def test_predictions_run_on_the_fast_copy_not_the_hooked_module() -> None:
    """A model with a prediction path (fused or compiled copy) predicts with it; the eager module, the one hooks
    are registered on, never runs a prediction."""
    eager, fast = Recorder(), Recorder()
    model = loaded(eager)
    model.fast, model.prediction_path = fast, "fused"
    executor = ModelExecutor(model, ExecutorConfig(threads=1))
    try:
        out = asyncio.run(executor.predict(samples(1)[0]))
    finally:
        executor.stop(5.0)
    assert torch.equal(out, expected(samples(1)[0]))
    assert (eager.batch_sizes, fast.batch_sizes) == ([], [1])
