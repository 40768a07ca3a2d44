"""Closed vocabularies of the API: capture sides, reductions, answer formats, tensor dtype names.

Torch-free, so request schemas (and the OpenAPI page) can use them without loading torch.
Which binary formats exist, and how each is written, is `service.codecs.formats`' table;
`tests/unit/codecs/test_formats.py` checks that every binary member here has a row there.
"""

from __future__ import annotations

from enum import StrEnum

TENSOR_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
"""dtype names a request may give a tensor in (the dtype table `service.dtypes` knows each)."""


class Capture(StrEnum):
    """Which side of a layer /activations records."""

    output = "output"
    input = "input"
    both = "both"


class Reduce(StrEnum):
    """How /activations shrinks a tensor `[N, C, ...]`: over spatial dims, or to `[N, -1]`."""

    mean = "mean"
    max = "max"
    flatten = "flatten"


class TensorFormat(StrEnum):
    """How tensors come back."""

    json = "json"
    safetensors = "safetensors"
    npz = "npz"


class ActivationFormat(StrEnum):  # tensors, their statistics, a binary file, or a feature-map picture
    json = "json"
    stats = "stats"
    safetensors = "safetensors"
    npz = "npz"
    png = "png"


class SaliencyFormat(StrEnum):  # tensors, a binary file, or heatmaps over the inputs
    json = "json"
    safetensors = "safetensors"
    npz = "npz"
    png = "png"


class TensorFileFormat(StrEnum):  # one state-dict tensor as a file
    npy = "npy"
    safetensors = "safetensors"


class Datatype(StrEnum):  # Open Inference Protocol tensor datatypes (`service.dtypes` maps each numeric one)
    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BF16 = "BF16"
    BYTES = "BYTES"


class JobKindName(StrEnum):  # what a data-set job computes (POST /jobs)
    unit_stats = "unit_stats"
    exemplars = "exemplars"
    similarity = "similarity"
    steering_vector = "steering_vector"
    features = "features"


class JobState(StrEnum):  # a data-set job's life
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
