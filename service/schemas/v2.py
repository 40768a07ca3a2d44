"""Open Inference Protocol (KServe v2 / Triton) REST bodies: metadata, infer, repository."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.specs.vocab import Datatype

INFER_REQUEST_EXAMPLE: dict[str, Any] = {
    "id": "42",
    "inputs": [{"name": "input__0", "shape": [1, 3, 2, 2], "datatype": "FP32", "data": [0.1] * 12}],
    "outputs": [
        {"name": "output__0", "parameters": {"classification": 3}},
        {"name": "conv1", "parameters": {"binary_data": False}},
    ],
}


class ServerMetadata(BaseModel):
    """`GET /v2`."""

    name: str = Field(..., examples=["hookserve"])
    version: str = Field(..., examples=["0.1.0"])
    extensions: list[str] = Field(..., examples=[["binary_tensor_data", "classification", "model_repository"]])


class TensorMetadata(BaseModel):
    """One input or output of a model; -1 is a variable dimension (the batch)."""

    name: str = Field(..., examples=["input__0"])
    datatype: Datatype = Field(..., examples=["FP32"])
    shape: list[int] = Field(..., examples=[[-1, 3, 32, 32]])


class ModelMetadata(BaseModel):
    """`GET /v2/models/{name}`."""

    name: str = Field(..., examples=["lenet"])
    versions: list[str] = Field(..., examples=[["1"]])
    platform: str = Field(..., examples=["pytorch"])
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata] = Field(
        ..., description="The model's outputs. Any layer name from /models/{name}/layers may also be requested."
    )


class Live(BaseModel):
    live: bool = Field(..., examples=[True])


class Ready(BaseModel):
    ready: bool = Field(..., examples=[True])


class ModelReady(BaseModel):
    name: str = Field(..., examples=["lenet"])
    ready: bool = Field(..., examples=[True])


class InferInputTensor(BaseModel):
    """One input tensor: `data` in JSON (flat or nested, row-major), or `binary_data_size` bytes after the JSON."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., examples=["input__0"])
    shape: list[int] = Field(..., max_length=8, examples=[[1, 3, 32, 32]])
    datatype: Datatype = Field(..., examples=["FP32"])
    parameters: dict[str, Any] | None = Field(None, examples=[{"binary_data_size": 12288}])
    data: Any | None = Field(None, description="The elements; absent when the data is binary.")


class InferRequestedOutput(BaseModel):
    """An output to return: `output__0`.. (the model's outputs) or any layer name (its output, our extension)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., examples=["output__0"])
    parameters: dict[str, Any] | None = Field(
        None,
        description="`binary_data` (bool): bytes after the JSON; `classification` (int k): top-k as "
        '"<value>:<index>:<label>" strings.',
        examples=[{"binary_data": True, "classification": 3}],
    )


class InferRequest(BaseModel):
    """The JSON of `POST /v2/models/{name}/infer` (the header, when binary tensors follow it)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [INFER_REQUEST_EXAMPLE]})

    id: str | None = Field(None, description="Echoed in the answer.")
    parameters: dict[str, Any] | None = Field(
        None, description="`binary_data_output` (bool): the default for outputs that do not say."
    )
    inputs: list[InferInputTensor] = Field(..., min_length=1, max_length=8)
    outputs: list[InferRequestedOutput] | None = Field(
        None, description="Absent or empty: every model output (`output__0`, ...)."
    )


class InferOutputTensor(BaseModel):
    name: str = Field(..., examples=["output__0"])
    shape: list[int] = Field(..., examples=[[1, 3]])
    datatype: Datatype = Field(..., examples=["BYTES"])
    parameters: dict[str, Any] | None = Field(None, examples=[{"binary_data_size": 52}])
    data: list[Any] | None = Field(None, description="Row-major, flat; absent when binary.")


class InferResponse(BaseModel):
    """The answer's JSON (its header, when binary outputs follow: see `Inference-Header-Content-Length`)."""

    model_config = ConfigDict(protected_namespaces=())

    model_name: str = Field(..., examples=["lenet"])
    model_version: str = Field("1", examples=["1"])
    id: str | None = None
    outputs: list[InferOutputTensor] = Field(
        ...,
        examples=[
            [{"name": "output__0", "shape": [1, 3], "datatype": "BYTES", "data": ["9.8:3:3", "4.1:8:8", "1.2:5:5"]}]
        ],
    )


class RepositoryIndexRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ready: bool = Field(False, description="Only list models that are ready.")


class RepositoryModel(BaseModel):
    name: str = Field(..., examples=["lenet"])
    version: str = Field("1", examples=["1"])
    state: str = Field(..., description="READY | LOADING | UNAVAILABLE", examples=["READY"])
    reason: str = Field("", examples=[""])


class RepositoryLoadRequest(BaseModel):
    """`parameters.config`: a JSON model spec (the fields of POST /models) to load a new model under this name."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{}, {"parameters": {"config": '{"source": "torchvision", "architecture": "resnet18"}'}}]
        },
    )

    parameters: dict[str, Any] | None = None


class RepositoryUnloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    parameters: dict[str, Any] | None = Field(None, examples=[{"unload_dependents": False}])


class StatisticDuration(BaseModel):
    count: int = Field(..., examples=[12])
    ns: int = Field(..., description="Cumulative nanoseconds.", examples=[48_500_000])


class InferStatistics(BaseModel):
    """Requests answered or failed (from entering the model's queue to the answer), time queued, and their
    batches' time moving inputs to the device, running the model and bringing the outputs back."""

    success: StatisticDuration
    fail: StatisticDuration
    queue: StatisticDuration
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration
    cache_hit: StatisticDuration
    cache_miss: StatisticDuration


class BatchStatistics(BaseModel):
    batch_size: int = Field(..., examples=[8])
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration


class ModelStatistics(BaseModel):
    name: str = Field(..., examples=["lenet"])
    version: str = Field(..., examples=["1"])
    last_inference: int = Field(..., description="Milliseconds since the epoch; 0 before the first.")
    inference_count: int = Field(..., description="Samples answered.")
    execution_count: int = Field(..., description="Batches run.")
    inference_stats: InferStatistics
    batch_stats: list[BatchStatistics]
    memory_usage: list[dict[str, Any]]


class ModelStatisticsAnswer(BaseModel):
    """`GET /v2/models/{name}/stats` (Triton's statistics extension)."""

    model_stats: list[ModelStatistics]


class ErrorV2(BaseModel):
    """Every error under /v2."""

    error: str = Field(..., examples=["no model named 'foo'; GET /models lists them"])
