"""Predictions: top-k class probabilities of each input, from the model's dynamic batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.dataplane.base import PlaneBase
from service.dataplane.costs import ADVICE_PREDICT, predict_cost
from service.introspection.predictions import require_class_scores, top_k_predictions
from service.runtime.runners.predict import PREDICT
from service.schemas.predict import PredictRequest


@dataclass(frozen=True)
class Predictions:
    model: str
    predictions: list[dict[str, Any]]


class Inference(PlaneBase):
    async def predict(self, body: PredictRequest, images: Sequence[bytes] | None) -> Predictions:
        served = self.ready(body.model)
        model = served.model

        def post(output: Any) -> list[dict[str, Any]]:
            scores = require_class_scores(output, model.name)
            return top_k_predictions(scores, body.top_k, model.label, body.include_logits)

        _, predictions = await self.run_admitted(
            served,
            PREDICT,
            self.decode(body.inputs, images, model),
            request=post,
            estimate=predict_cost,
            answer=("json", ADVICE_PREDICT),
            dry_run=body.dry_run,
        )
        return Predictions(model.name, predictions)
