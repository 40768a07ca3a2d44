"""Triton's model configuration and statistics as the protocol's messages, and as the JSON Triton's REST answers.

One table, the protobuf messages: gRPC answers them as they are; REST answers their JSON form with
proto field names, every field printed (defaults included) and 64-bit integers as JSON numbers,
as Triton's HTTP endpoints do. So both fronts say the same thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from service.codecs.protos import inference_pb2 as pb
from service.runtime.statistics import BatchStatistics, Duration, Statistics

PLATFORM = "pytorch_libtorch"  # what Triton's PyTorch backend reports
BACKEND = "pytorch"


@dataclass(frozen=True)
class ConfigTensor:
    name: str
    datatype: str  # an Open Inference Protocol datatype (FP32, ...)
    dims: list[int]  # without the batch dimension
    format: str = "FORMAT_NONE"
    label_filename: str = ""


@dataclass(frozen=True)
class ModelConfigInfo:
    """A served model in the terms of Triton's model configuration."""

    name: str
    max_batch_size: int
    inputs: list[ConfigTensor]
    outputs: list[ConfigTensor]
    max_queue_delay_us: int
    max_queue_size: int
    timeout_us: int
    instance_kind: str  # KIND_CPU | KIND_GPU
    instance_count: int  # worker threads running batches side by side
    gpus: list[int]
    default_model_filename: str
    parameters: dict[str, str] = field(default_factory=dict)
    platform: str = PLATFORM
    backend: str = BACKEND


_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def as_json(message: Message) -> dict[str, Any]:
    """`message` as Triton's REST prints it: proto names, defaults included, 64-bit integers as numbers."""
    data = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _numbers(message.DESCRIPTOR, data)


def _numbers(descriptor: Any, data: dict[str, Any]) -> dict[str, Any]:
    """Turn the 64-bit integers protobuf's JSON writes as strings back into numbers (in place)."""
    for name, value in data.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name["value"]
            if entry.message_type is not None:
                for item in value.values():
                    _numbers(entry.message_type, item)
        elif field.message_type is not None:
            for item in value if isinstance(value, list) else [value]:
                _numbers(field.message_type, item)
        elif field.type in _INT64:
            data[name] = [int(v) for v in value] if isinstance(value, list) else int(value)
    return data


def config_message(info: ModelConfigInfo) -> pb.ModelConfig:
    """The model as Triton's `ModelConfig`."""
    config = pb.ModelConfig(
        name=info.name,
        platform=info.platform,
        backend=info.backend,
        max_batch_size=info.max_batch_size,
        default_model_filename=info.default_model_filename,
    )
    config.version_policy.latest.num_versions = 1
    for tensor in info.inputs:
        config.input.add(
            name=tensor.name,
            data_type=pb.DataType.Value(f"TYPE_{tensor.datatype}"),
            format=pb.ModelInput.Format.Value(tensor.format),
            dims=tensor.dims,
        )
    for tensor in info.outputs:
        config.output.add(
            name=tensor.name,
            data_type=pb.DataType.Value(f"TYPE_{tensor.datatype}"),
            dims=tensor.dims,
            label_filename=tensor.label_filename,
        )
    batching = config.dynamic_batching
    batching.max_queue_delay_microseconds = info.max_queue_delay_us
    policy = batching.default_queue_policy
    policy.timeout_action = pb.ModelQueuePolicy.REJECT
    policy.default_timeout_microseconds = info.timeout_us
    policy.max_queue_size = info.max_queue_size
    config.instance_group.add(
        name=f"{info.name}_0",
        kind=pb.ModelInstanceGroup.Kind.Value(info.instance_kind),
        count=info.instance_count,
        gpus=info.gpus,
    )
    for key, value in info.parameters.items():
        config.parameters[key].string_value = value
    return config


def _duration(target: pb.StatisticDuration, source: Duration) -> None:
    target.count = source.count
    target.ns = source.ns


def _batch(target: pb.InferBatchStatistics, source: BatchStatistics) -> None:
    target.batch_size = source.batch_size
    _duration(target.compute_input, source.compute_input)
    _duration(target.compute_infer, source.compute_infer)
    _duration(target.compute_output, source.compute_output)


def statistics_message(models: Sequence[tuple[str, str, Statistics]]) -> pb.ModelStatisticsResponse:
    """(name, version, statistics) per model as Triton's `ModelStatisticsResponse`."""
    answer = pb.ModelStatisticsResponse()
    for name, version, s in models:
        entry = answer.model_stats.add(
            name=name,
            version=version,
            last_inference=s.last_inference_ms,
            inference_count=s.inference_count,
            execution_count=s.execution_count,
        )
        stats = entry.inference_stats
        for kind in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
            _duration(getattr(stats, kind), getattr(s, kind))
        stats.cache_hit.SetInParent()  # no response cache: zero, as Triton reports without one
        stats.cache_miss.SetInParent()
        for batch in s.batches:
            _batch(entry.batch_stats.add(), batch)
    return answer
