"""The Python client of hookserve: tensors in, tensors out, over HTTP only.

    from service.client import Client

    with Client("http://127.0.0.1:8000") as client:
        acts = client.activations("lenet", "service/zoo/samples/digit_7.png", ["conv1", "fc3"])
        acts.output("conv1").shape          # (1, 6, 28, 28), a NumPy array
        acts.to_torch().output("fc3")       # the same as a torch tensor

Inputs are images (paths, bytes, PIL images) or preprocessed samples (NumPy arrays, torch
tensors); tensors travel as safetensors (`wire="json"` for plain JSON). Failed calls raise
`HookserveError` subclasses carrying `status` and the server's `detail`. The client never
imports the server: it needs httpx, NumPy and Pillow (torch only for `to_torch()`).
`read_features` and `extract_features` (bulk feature extraction) are here too.
"""

from __future__ import annotations

from service.client.aio import AsyncClient
from service.client.calls import DEFAULT, Wire
from service.client.errors import (
    BadRequest,
    Conflict,
    DeadlineExceeded,
    Forbidden,
    HookserveError,
    InvalidRequest,
    NotFound,
    RequestTimeout,
    ServerError,
    ServiceUnavailable,
    TooLarge,
    TransportError,
    Unauthorized,
)
from service.client.features import extract_features, read_features
from service.client.metadata import (
    CheckpointInfo,
    Health,
    Layer,
    ModelInfo,
    Node,
    Nodes,
    OptimizerInfo,
    StateDict,
    StateDictEntry,
    Summary,
    SummaryRow,
)
from service.client.results import (
    Activations,
    ActivationStats,
    AttentionMaps,
    Change,
    ChannelEffect,
    ClassScore,
    CostEstimate,
    Gradients,
    HeadEffect,
    Intervention,
    Prediction,
    Predictions,
    Saliency,
    SaliencyMap,
    Sweep,
    TensorStats,
    TokenInfo,
)
from service.client.retry import NO_RETRY, Retry
from service.client.sync import Client

__all__ = [
    "DEFAULT",
    "NO_RETRY",
    "ActivationStats",
    "Activations",
    "AsyncClient",
    "AttentionMaps",
    "BadRequest",
    "Change",
    "ChannelEffect",
    "CheckpointInfo",
    "ClassScore",
    "Client",
    "Conflict",
    "CostEstimate",
    "DeadlineExceeded",
    "Forbidden",
    "Gradients",
    "HeadEffect",
    "Health",
    "HookserveError",
    "Intervention",
    "InvalidRequest",
    "Layer",
    "ModelInfo",
    "Node",
    "Nodes",
    "NotFound",
    "OptimizerInfo",
    "Prediction",
    "Predictions",
    "RequestTimeout",
    "Retry",
    "Saliency",
    "SaliencyMap",
    "ServerError",
    "ServiceUnavailable",
    "StateDict",
    "StateDictEntry",
    "Summary",
    "SummaryRow",
    "Sweep",
    "TensorStats",
    "TokenInfo",
    "TooLarge",
    "TransportError",
    "Unauthorized",
    "Wire",
    "extract_features",
    "read_features",
]
