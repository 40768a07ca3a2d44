"""float16, bfloat16 and every /v2 datatype, end to end, checked against the libraries' own definitions.

Expected dtypes come from torch, NumPy, safetensors' own reader and tritonclient's
`triton_to_np_dtype`, never from the service's dtype tables, so a wrong or swapped table
entry shows up as a wrong answer here.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import httpx2
import ml_dtypes
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from fastapi.testclient import TestClient
from safetensors.torch import load as safetensors_load
from tritonclient.utils import triton_to_np_dtype

from service.config import Settings
from service.main import create_app
from tests.conftest import b64, read_binary_answer, wait_settled
from tests.helpers.config import toy_entry
from tests.helpers.models import CONSTANTS, WIDTH, Affine

HALVES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# Small multiples of 1/4 against Affine's weights: every product and sum is exact in float16 and bfloat16.
X = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.0, 2.0, 5.0]])


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    model_dir = tmp_path_factory.mktemp("dtypes")
    config = "".join(toy_entry(name, "Affine", dtype=name) for name in HALVES)
    config += toy_entry("constants", "Constants") + toy_entry("echo", "Echo")
    (model_dir / "models.toml").write_text(config)
    settings = Settings(model_dir=model_dir, config=model_dir / "models.toml", worker_threads=1, torch_threads=1)
    with TestClient(create_app(settings)) as c:
        wait_settled(c)
        yield c


def as_numpy(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """NumPy's own view of a tensor; bfloat16 as ml_dtypes.bfloat16 (what tritonclient uses)."""
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


def affine_reference(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    model = Affine().to(dtype)
    with torch.no_grad():
        return model(x.to(dtype))  # type: ignore[no-any-return]


def raw_input(x: torch.Tensor) -> dict[str, Any]:
    """One sample as a base64 tensor input in its own dtype (bfloat16 as its 16-bit patterns)."""
    raw = (x.view(torch.int16) if x.dtype == torch.bfloat16 else x).numpy().tobytes()
    return {"tensor": {"shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch."), "b64": b64(raw)}}


# ---- REST: safetensors, npz, npy and JSON answers of half-precision models ---------------------


@pytest.mark.parametrize("fmt", ["safetensors", "npz", "json"])
@pytest.mark.parametrize("name", list(HALVES))
def test_half_precision_activations_round_trip(client: TestClient, name: str, fmt: str) -> None:
    """The input sent (in the model's dtype) comes back bit for bit, the output equals torch's."""
    dtype = HALVES[name]
    x = X.to(dtype)
    body = {"model": name, "inputs": [raw_input(row) for row in x], "layers": ["fc"], "capture": "both"}
    r = client.post("/activations", json=body | {"format": fmt})
    assert r.status_code == 200, r.text
    expected = {"input": x, "output": affine_reference(X, dtype)}
    if fmt == "safetensors":
        tensors, rest = read_binary_answer(r.content, fmt)  # safetensors' own reader
        for side, want in expected.items():
            got = tensors[f"fc:{side}"]
            assert got.dtype == dtype, side
            assert torch.equal(got, want), side
            assert rest["activations"]["fc"][side] == {"shape": [2, 3 if side == "output" else WIDTH], "dtype": name}
    elif fmt == "npz":
        arrays, _ = read_binary_answer(r.content, fmt)
        for side, want in expected.items():
            got = arrays[f"fc:{side}"]
            # NumPy has float16; bfloat16 is widened to float32, the same values (API.md)
            assert got.dtype == (torch.float16 if dtype == torch.float16 else torch.float32), side
            assert torch.equal(got, want.to(got.dtype)), side
    else:
        for side, want in expected.items():
            answer = r.json()["activations"]["fc"][side]
            assert answer["dtype"] == name
            assert torch.equal(torch.tensor(answer["data"], dtype=torch.float64), want.double()), side


@pytest.mark.parametrize("name", list(HALVES))
def test_half_precision_state_dict_downloads(client: TestClient, name: str) -> None:
    dtype = HALVES[name]
    weight = torch.tensor(Affine.WEIGHT, dtype=dtype)
    url = f"/models/{name}/state-dict"
    r = client.get(url, params={"key": "fc.weight", "format": "safetensors"})
    assert r.status_code == 200, r.text
    got = safetensors_load(r.content)["fc.weight"]
    assert got.dtype == dtype
    assert torch.equal(got, weight)
    r = client.get(url, params={"key": "fc.weight", "format": "npy"})
    assert r.status_code == 200, r.text
    array = np.load(io.BytesIO(r.content), allow_pickle=False)
    assert array.dtype == (np.float16 if dtype == torch.float16 else np.float32)
    np.testing.assert_array_equal(array, weight.float().numpy())
    entries = {e["key"]: e for e in client.get(url).json()["entries"]}
    assert entries["fc.weight"]["dtype"] == name
    assert entries["fc.weight"]["bytes"] == weight.numel() * 2


# ---- /v2: every datatype out, every datatype in ------------------------------------------------


def v2_post(client: TestClient, model: str, body: bytes, json_size: int | None) -> triton.InferResult:
    headers = {"Content-Type": "application/octet-stream"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    r = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    length = r.headers.get("Inference-Header-Content-Length")
    return triton.InferResult.from_response_body(r.content, header_length=None if length is None else int(length))


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_output_dtype_has_its_datatype_and_values(client: TestClient, binary: bool) -> None:
    """One output per torch dtype (`Constants`): datatype and values as tritonclient reads them."""
    x = triton.InferInput("input__0", [2, WIDTH], "FP32")
    x.set_data_from_numpy(np.zeros((2, WIDTH), dtype=np.float32))
    names = [f"output__{i}" for i in range(len(CONSTANTS))]
    outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in names]
    body, json_size = triton.InferenceServerClient.generate_request_body([x], outputs)
    result = v2_post(client, "constants", body, json_size)
    for name, (dtype, values) in zip(names, CONSTANTS.items(), strict=True):
        expected = np.tile(as_numpy(torch.tensor(values, dtype=dtype)), (2, 1))
        entry = result.get_output(name)
        assert entry is not None
        assert np.dtype(triton_to_np_dtype(entry["datatype"])) == expected.dtype, (dtype, entry["datatype"])
        got = result.as_numpy(name)
        assert got is not None
        assert got.dtype == expected.dtype, dtype
        np.testing.assert_array_equal(got, expected, err_msg=str(dtype))


# Values at each type's edges, by the protocol's datatype names; the reference dtype is tritonclient's.
INPUTS: dict[str, list[Any]] = {
    "BOOL": [True, False, True, True],
    "UINT8": [0, 1, 200, 255],
    "UINT16": [0, 1, 40000, 65535],
    "UINT32": [0, 1, 3_000_000_000, 2**32 - 1],
    "UINT64": [0, 1, 2**63 + 5, 2**64 - 1],
    "INT8": [-128, -1, 0, 127],
    "INT16": [-32768, -1, 0, 32767],
    "INT32": [-(2**31), -1, 0, 2**31 - 1],
    "INT64": [-(2**63), -1, 0, 2**63 - 1],
    "FP16": [0.1, -2.5e-3, 65504.0, 6e-8],
    "FP32": [0.1, -2.5e-3, 3.0e38, 1e-45],
    "FP64": [0.1, -2.5e-3, 1e30, 1e-40],
    "BF16": [0.1, -2.5e-3, 3.0e38, 1.00390625],
}


def input_rows(datatype: str) -> np.ndarray[Any, Any]:
    """Two samples: the values, and the values reversed, in tritonclient's dtype for `datatype`."""
    values = INPUTS[datatype]
    return np.array([values, values[::-1]], dtype=triton_to_np_dtype(datatype))


def echo_json(client: TestClient, datatype: str, array: np.ndarray[Any, Any]) -> httpx2.Response:
    data = array.astype(np.float32).tolist() if datatype == "BF16" else array.tolist()
    tensor = {"name": "input__0", "shape": list(array.shape), "datatype": datatype, "data": data}
    return client.post("/v2/models/echo/infer", json={"inputs": [tensor]})


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", list(INPUTS))
def test_every_input_datatype_is_read_as_its_values(client: TestClient, datatype: str, binary: bool) -> None:
    """`echo` (float32) answers its input: each datatype's values, converted to float32 as NumPy does."""
    array = input_rows(datatype)
    expected = array.astype(np.float32)
    if binary:
        x = triton.InferInput("input__0", list(array.shape), datatype)
        x.set_data_from_numpy(array, binary_data=True)
        body, json_size = triton.InferenceServerClient.generate_request_body([x])
        got = v2_post(client, "echo", body, json_size).as_numpy("output__0")
    else:
        r = echo_json(client, datatype, array)
        assert r.status_code == 200, r.text
        out = r.json()["outputs"][0]
        assert out["datatype"] == "FP32"
        got = np.array(out["data"], dtype=np.float32).reshape(out["shape"])
    np.testing.assert_array_equal(got, expected)
