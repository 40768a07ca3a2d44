"""The committed protoc output is what `inference.proto` compiles to, and its wire format is Triton's."""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import service_pb2 as triton

from service.codecs.protos import generate
from service.codecs.protos import inference_pb2 as pb


def test_generated_modules_are_current(tmp_path: Path) -> None:
    for made in generate.generate(tmp_path):
        committed = generate.HERE / made.name
        assert made.read_bytes() == committed.read_bytes(), (
            f"{made.name} is stale: run python -m service.codecs.protos.generate"
        )


def test_messages_have_tritons_field_numbers() -> None:
    """Every field hookserve declares has the number, type and label of the field of that name in Triton's proto."""
    checked = 0
    for name, ours in pb.DESCRIPTOR.message_types_by_name.items():
        theirs = triton.DESCRIPTOR.message_types_by_name.get(name)
        if theirs is None:  # model_config.proto's messages: in tritonclient's model_config_pb2
            from tritonclient.grpc import model_config_pb2

            theirs = model_config_pb2.DESCRIPTOR.message_types_by_name[name]
        checked += _same_fields(ours, theirs)
    assert checked > 150


def _same_fields(ours: object, theirs: object) -> int:
    count = 0
    for field in ours.fields:  # type: ignore[attr-defined]
        other = theirs.fields_by_name[field.name]  # type: ignore[attr-defined]
        assert (field.number, field.type) == (other.number, other.type), f"{field.full_name}"
        count += 1
    for nested in ours.nested_types:  # type: ignore[attr-defined]
        count += _same_fields(nested, theirs.nested_types_by_name[nested.name])  # type: ignore[attr-defined]
    return count
