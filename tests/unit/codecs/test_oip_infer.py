"""The torch side of /v2: output naming, classification strings, input batches, requests in and answers out."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from service.codecs.images import image_to_tensor
from service.codecs.oip import float32_to_bf16_bits
from service.codecs.oip_infer import (
    as_array,
    classify,
    decode_infer,
    encode_infer,
    flatten_outputs,
    image_batch,
    tensor_batch,
)
from service.config import Settings
from service.dataplane.oip import OutputPlan, plan_outputs
from service.errors import BadInput, InvalidField, TooLarge
from service.registry.loaded import LoadedModel
from service.specs.model import PreprocessSpec
from service.specs.vocab import Datatype
from tests.helpers.loaded import loaded_model


class Tiny(nn.Module):
    """conv -> shared relu -> pool -> fc -> shared relu; 2 channels in, 3 classes out."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.relu = nn.ReLU()
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv(x)).amax(dim=(2, 3), keepdim=True)
        return self.relu(self.head(x))  # type: ignore[no-any-return]


def loaded(labels: list[str] | None = None) -> LoadedModel:
    return loaded_model(Tiny(), [2, 5, 5], name="tiny", labels=labels, num_classes=3)


def test_classify_format_order_and_ties() -> None:
    scores = torch.tensor([[0.5, 2.0, -1.25, 2.0], [1e-7, -3.0, 7.0, 0.0]])
    out = classify(scores, 3, lambda i: "abcd"[i])
    assert out.shape == (2, 3)
    assert out.tolist() == [
        [b"2.000000:1:b", b"2.000000:3:d", b"0.500000:0:a"],
        [b"7.000000:2:c", b"0.000000:0:a", b"0.000000:3:d"],
    ]
    assert classify(scores, 10, str).shape == (2, 4)
    feature_maps = torch.zeros(1, 2, 2, 2)
    feature_maps[0, 1, 0, 1] = 3.0
    assert classify(feature_maps, 1, str).tolist() == [[b"3.000000:5:5"]]
    with pytest.raises(InvalidField, match="scalar"):
        classify(torch.tensor(1.0), 1, str)


def test_flatten_outputs() -> None:
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    assert flatten_outputs(a) == [a]
    assert flatten_outputs((a, [b, {"x": c, "n": 3}])) == [a, b, c]
    assert flatten_outputs({"logits": a, "aux": (b,)}) == [a, b]
    assert flatten_outputs(None) == []


def test_plan_outputs() -> None:
    plan = plan_outputs(loaded(), ["output__1", "conv", "relu#2", "head.1", "head.0.0"])
    assert plan == OutputPlan(
        model_outputs={"output__1": 1},
        layers={"conv": "conv", "relu#2": "relu", "head.1": "head.1", "head.0.0": "head.0"},
    )
    with pytest.raises(InvalidField, match=r"unknown output 'haed': .* closest: 'head'"):
        plan_outputs(loaded(), ["haed"])


def test_tensor_batch_checks() -> None:
    model = loaded()
    ints = np.arange(50, dtype=np.int16).reshape(1, 2, 5, 5)
    batch = tensor_batch(ints, Datatype.INT16, model, 4)
    assert batch.dtype == torch.float32
    assert batch.shape == (1, 2, 5, 5)
    assert batch[0, 1, 4, 4].item() == 49.0
    bigger = tensor_batch(np.zeros((2, 2, 9, 7), dtype=np.float32), Datatype.FP32, model, 4)
    assert bigger.shape == (2, 2, 9, 7)
    bits = float32_to_bf16_bits(np.full((1, 2, 5, 5), 1.5, dtype=np.float32))
    half = tensor_batch(bits, Datatype.BF16, model, 4)
    assert half.dtype == torch.bfloat16
    assert bool((half.float() == 1.5).all())
    with pytest.raises(InvalidField, match=r"has shape \[1, 3, 5, 5\]; tiny takes \[-1, 2, 5, 5\]"):
        tensor_batch(np.zeros((1, 3, 5, 5), dtype=np.float32), Datatype.FP32, model, 4)
    with pytest.raises(InvalidField, match="has shape"):
        tensor_batch(np.zeros((2, 5, 5), dtype=np.float32), Datatype.FP32, model, 4)
    with pytest.raises(TooLarge, match="5 samples, over the limit of 4"):
        tensor_batch(np.zeros((5, 2, 5, 5), dtype=np.float32), Datatype.FP32, model, 4)
    with pytest.raises(InvalidField, match="no samples"):
        tensor_batch(np.zeros((0, 2, 5, 5), dtype=np.float32), Datatype.FP32, model, 4)
    nan = np.zeros((1, 2, 5, 5), dtype=np.float32)
    nan[0, 0, 0, 0] = np.nan
    with pytest.raises(InvalidField, match="NaN"):
        tensor_batch(nan, Datatype.FP32, model, 4)


def test_as_array_bf16_bits() -> None:
    datatype, array = as_array(torch.tensor([1.5, -2.0], dtype=torch.bfloat16))
    assert datatype is Datatype.BF16
    assert array.dtype == np.uint16
    assert array.tolist() == [0x3FC0, 0xC000]
    with pytest.raises(InvalidField, match="no Open Inference Protocol datatype"):
        as_array(torch.zeros(1, dtype=torch.complex64))


def test_a_nan_stays_a_nan_in_bf16_whatever_its_payload() -> None:
    """Rounding a NaN whose payload sits in the low 16 bits would give infinity (0x7F80): NaNs keep a mantissa bit."""
    nans = np.array([0x7F800001, 0xFF800001, 0x7FC00000], dtype=np.uint32).view(np.float32)
    bits = float32_to_bf16_bits(nans)
    assert all((b & 0x7F80) == 0x7F80 and (b & 0x007F) != 0 for b in bits.tolist()), [hex(b) for b in bits.tolist()]
    assert (bits >> 15).tolist() == [0, 1, 0]  # the sign is kept


def header(**request: object) -> bytes:
    return json.dumps(request).encode()


def test_decode_infer() -> None:
    model, settings = loaded(), Settings(max_inputs=4)
    x = np.random.default_rng(0).standard_normal((2, 2, 5, 5)).astype(np.float32)
    tensor = {
        "name": "input__0",
        "shape": [2, 2, 5, 5],
        "datatype": "FP32",
        "parameters": {"binary_data_size": x.nbytes},
    }
    outputs = [
        {"name": "output__0", "parameters": {"classification": 2}},
        {"name": "conv", "parameters": {"binary_data": True}},
    ]
    decoded = decode_infer(header(id="q", inputs=[tensor], outputs=outputs), x.tobytes(), model, settings)
    assert decoded.id == "q"
    np.testing.assert_array_equal(decoded.batch.numpy(), x)
    assert decoded.outputs is not None
    assert [(o.name, o.binary, o.classification) for o in decoded.outputs] == [
        ("output__0", False, 2),
        ("conv", True, 0),
    ]
    everything = decode_infer(
        header(inputs=[tensor], parameters={"binary_data_output": True}), x.tobytes(), model, settings
    )
    assert everything.outputs is None
    assert everything.default_binary
    assert decode_infer(header(inputs=[tensor], outputs=[]), x.tobytes(), model, settings).outputs is None
    with pytest.raises(BadInput, match="only 10 bytes follow"):
        decode_infer(header(inputs=[tensor]), bytes(10), model, settings)
    with pytest.raises(InvalidField, match="requested twice"):
        decode_infer(
            header(inputs=[tensor], outputs=[{"name": "conv"}, {"name": "conv"}]), x.tobytes(), model, settings
        )
    with pytest.raises(InvalidField, match="classification must be"):
        decode_infer(
            header(inputs=[tensor], outputs=[{"name": "conv", "parameters": {"classification": "3"}}]),
            x.tobytes(),
            model,
            settings,
        )
    with pytest.raises(InvalidField, match=r"inputs\.0\.datatype"):
        decode_infer(header(inputs=[{**tensor, "datatype": "FP8"}]), x.tobytes(), model, settings)
    shared = {**tensor, "parameters": {"shared_memory_region": "r"}}
    with pytest.raises(BadInput, match="shared memory"):
        decode_infer(header(inputs=[shared]), b"", model, settings)


def test_encode_infer_labels_only_model_outputs() -> None:
    model, settings = loaded(["cat", "dog", "eel"]), Settings()
    tensor = {"name": "input__0", "shape": [1, 2, 5, 5], "datatype": "FP32", "data": [0.0] * 50}
    outputs = [
        {"name": "output__0", "parameters": {"classification": 1}},
        {"name": "conv", "parameters": {"classification": 1}},
    ]
    decoded = decode_infer(header(inputs=[tensor], outputs=outputs), b"", model, settings)
    logits = torch.tensor([[0.0, 4.0, 1.0]])
    conv = torch.zeros(1, 4, 3, 3)
    conv[0, 2, 1, 1] = 9.0
    body, header_length = encode_infer(model, decoded, {"output__0": logits, "conv": conv}, settings)
    assert header_length is None
    answer = json.loads(body)
    assert [o["data"] for o in answer["outputs"]] == [["4.000000:1:dog"], ["9.000000:22:22"]]
    with pytest.raises(TooLarge, match=r"^the JSON part of the answer would be at least \d+ bytes, over the 50-byte"):
        encode_infer(model, decoded, {"output__0": logits, "conv": conv}, Settings(max_json_response_bytes=50))


def test_answer_limits_admit_an_answer_of_exactly_their_size() -> None:
    model = loaded()
    tensor = {"name": "input__0", "shape": [1, 2, 5, 5], "datatype": "FP32", "data": [0.0] * 50}
    logits = {"output__0": torch.tensor([[0.0, 4.0, 1.0]])}
    binary = decode_infer(header(inputs=[tensor], parameters={"binary_data_output": True}), b"", model, Settings())
    _, header_length = encode_infer(model, binary, logits, Settings(max_binary_response_bytes=12))  # 3 float32s
    assert header_length is not None
    with pytest.raises(TooLarge, match="max_binary_response_bytes"):
        encode_infer(model, binary, logits, Settings(max_binary_response_bytes=11))
    as_json = decode_infer(header(inputs=[tensor]), b"", model, Settings())
    body, _ = encode_infer(model, as_json, logits, Settings(max_json_response_bytes=200))
    assert json.loads(body)["outputs"][0]["data"] == [0.0, 4.0, 1.0]
    encode_infer(model, as_json, logits, Settings(max_json_response_bytes=len(body)))
    with pytest.raises(TooLarge, match="max_json_response_bytes"):
        encode_infer(model, as_json, logits, Settings(max_json_response_bytes=len(body) - 1))


def test_the_answer_echoes_the_requests_id_and_only_when_it_has_one() -> None:
    model, settings = loaded(), Settings()
    tensor = {"name": "input__0", "shape": [1, 2, 5, 5], "datatype": "FP32", "data": [0.0] * 50}
    logits = {"output__0": torch.tensor([[0.0, 4.0, 1.0]])}
    with_id = decode_infer(header(id="r-7", inputs=[tensor]), b"", model, settings)
    assert json.loads(encode_infer(model, with_id, logits, settings)[0])["id"] == "r-7"
    without = decode_infer(header(inputs=[tensor]), b"", model, settings)
    assert "id" not in json.loads(encode_infer(model, without, logits, settings)[0])


def test_bytes_inputs_are_images_preprocessed_like_predicts() -> None:
    flat = nn.Sequential(nn.Flatten(), nn.Linear(75, 3))
    model = loaded_model(flat, [3, 5, 5], name="flat", num_classes=3, preprocess=PreprocessSpec(resize=5, crop=5))
    pngs = []
    for value in (0, 255):
        buffer = io.BytesIO()
        Image.new("L", (5, 5), value).save(buffer, format="PNG")
        pngs.append(buffer.getvalue())
    batch = image_batch(np.array(pngs, dtype=object), model, max_inputs=4, max_pixels=100)
    want = [image_to_tensor(png, model.preprocess, model.channels, 100, "x") for png in pngs]
    torch.testing.assert_close(batch, torch.stack(want))
    assert not torch.equal(batch[0], batch[1])
