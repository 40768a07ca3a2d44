"""Predictions: one forward of the concatenated inputs on the prediction path, each request's `post` on its slice."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from service.registry.loaded import LoadedModel
from service.runtime.batching import run_batch
from service.runtime.runners.base import Runner
from service.runtime.statistics import Phase, phase

Post = Callable[[Any], Any] | None


class PredictRunner(Runner[Post]):
    """Batches plain forwards (no hooks); each request's `post` turns its output slice into its answer."""

    name = "predict"
    hooked = False

    def run(self, model: LoadedModel, inputs: Sequence[torch.Tensor], requests: Sequence[Post]) -> list[Any]:
        outputs = run_batch(model, inputs, model.prediction_module)
        answers: list[Any] = []
        with phase(Phase.output):
            for post, output in zip(requests, outputs, strict=True):
                try:
                    answers.append(post(output) if post is not None else output)
                except Exception as exc:  # this request's post-processing: its own failure
                    answers.append(exc)
        return answers


PREDICT = PredictRunner()
