"""Answers as TorchServe gives them: its image classifier's `{"label": probability}`, its explanations' nested
lists, its management API's JSON, and its error envelope `{"code", "type", "message"}` (no torch here).

TorchServe's Python worker writes a handler's dict or list answer with `json.dumps(answer, indent=2)`;
these answers are indented the same way, so a script comparing text sees what it saw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

# TorchServe's exception names by status, as its frontend reports them in `type`
ERROR_TYPES = {
    400: "BadRequestException",
    401: "InvalidKeyException",
    403: "InvalidKeyException",
    404: "ModelNotFoundException",
    405: "MethodNotAllowedException",
    409: "ConflictStatusException",
    413: "RequestEntityTooLargeException",
    422: "BadRequestException",
    499: "ClientClosedRequestException",
    503: "ServiceUnavailableException",
    504: "RequestTimeoutException",
}


def indented(content: Any) -> bytes:
    """JSON as TorchServe's worker writes it (two-space indent); NumPy arrays as nested lists."""
    return orjson.dumps(content, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)


def classifier_answer(top_k: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """One image's top classes as TorchServe's image_classifier answers: `{label: probability}`, most likely first."""
    return {str(item["label"]): float(item["score"]) for item in top_k}


def explanation_answer(attribution: np.ndarray[Any, Any]) -> list[Any]:
    """Integrated Gradients over the image, `[C][H][W]`, as TorchServe's `attributions.tolist()`."""
    answer: list[Any] = attribution.tolist()
    return answer


def error_body(status: int, message: str) -> bytes:
    """TorchServe's error envelope."""
    kind = ERROR_TYPES.get(status, "InternalServerException")
    return orjson.dumps({"code": status, "type": kind, "message": message}, option=orjson.OPT_INDENT_2)
