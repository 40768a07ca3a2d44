"""POST /checkpoints/inspect: uploads and model-dir paths, safetensors, compare_to, and pickles that would run code."""

from __future__ import annotations

import io
import os
import pickle
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save as safetensors_save
from safetensors.torch import save_file
from torch import nn

from service.config import Settings
from service.main import create_app
from service.zoo.lenet import LeNet
from tests.conftest import ClientFactory, wait_settled, write_lenet
from tests.helpers.checkpoints import shared_tensor_zip


class Evil:
    """Unpickling this calls `open(marker, "w")`: it creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def lenet_dir(root: Path) -> Path:
    (root / "models.toml").write_text(write_lenet(root))
    return root


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lenet_dir(tmp_path_factory.mktemp("ckpt_models"))


@pytest.fixture(scope="module")
def client(model_dir: Path) -> Iterator[TestClient]:
    settings = Settings(model_dir=model_dir, config=model_dir / "models.toml", worker_threads=1)
    with TestClient(create_app(settings)) as test_client:
        wait_settled(test_client)
        yield test_client


def trained_lenet() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = LeNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    for _ in range(2):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    return model, optimizer


def to_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def upload(client: TestClient, data: bytes, **params: Any) -> Any:
    return client.post("/checkpoints/inspect", files={"file": ("checkpoint.pt", data)}, params=params)


def entries(sd: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    buffers = ("running_mean", "running_var", "num_batches_tracked")
    return [
        {
            "key": k,
            "shape": list(v.shape),
            "dtype": str(v.dtype).removeprefix("torch."),
            "numel": v.numel(),
            "bytes": v.numel() * v.element_size(),
            "kind": "buffer" if k.rsplit(".", 1)[-1] in buffers else "parameter",
            "requires_grad": None,
        }
        for k, v in sd.items()
    ]


def test_training_checkpoint_upload(client: TestClient) -> None:
    model, optimizer = trained_lenet()
    sd = model.state_dict()
    checkpoint = {
        "epoch": 7,
        "loss": 0.25,
        "arch": "LeNet",
        "history": [1.5, 0.75],
        "model_state_dict": sd,
        "optimizer_state_dict": optimizer.state_dict(),
    }
    response = upload(client, to_bytes(checkpoint))
    assert response.status_code == 200, response.text
    got = response.json()
    assert got["format"] == "pickle"
    assert got["other"] == {"epoch": 7, "loss": 0.25, "arch": "LeNet", "history": [1.5, 0.75]}
    assert got["compare"] is None
    assert list(got["state_dicts"]) == ["model_state_dict"]
    found = got["state_dicts"]["model_state_dict"]
    assert found["entries"] == entries(sd)
    assert found["total_numel"] == 62006
    assert list(got["optimizers"]) == ["optimizer_state_dict"]
    opt = got["optimizers"]["optimizer_state_dict"]
    names = list(sd)
    saved = optimizer.state_dict()
    assert opt["type"] is None  # a state dict does not say which class wrote it
    assert opt["param_groups"] == [saved["param_groups"][0] | {"param_names": names}]
    assert opt["param_groups"][0]["weight_decay"] == 1e-4
    assert [(s["param"], s["param_name"]) for s in opt["state"]] == list(enumerate(names))
    for entry in opt["state"]:
        shape = list(sd[entry["param_name"]].shape)
        assert entry["entries"] == {"momentum_buffer": {"shape": shape, "dtype": "float32"}}


def test_path_under_model_dir_and_compare_to(client: TestClient, model_dir: Path) -> None:
    model, _ = trained_lenet()
    sd = dict(model.state_dict())
    del sd["fc3.bias"]
    sd["fc3.weight"] = torch.zeros(5, 84)
    sd["extra.weight"] = torch.ones(2)
    (model_dir / "sub").mkdir(exist_ok=True)
    torch.save({"state_dict": sd, "step": 100}, model_dir / "sub" / "finetune.pt")

    plain = client.post("/checkpoints/inspect", json={"path": "sub/finetune.pt"})
    assert plain.status_code == 200, plain.text
    assert plain.json()["compare"] is None
    assert plain.json()["other"] == {"step": 100}

    response = client.post("/checkpoints/inspect", json={"path": "sub/finetune.pt"}, params={"compare_to": "lenet"})
    assert response.status_code == 200, response.text
    got = response.json()
    assert got["state_dicts"]["state_dict"]["entries"] == entries(sd)
    assert got["compare"] == {
        "missing_keys": ["fc3.bias"],
        "unexpected_keys": ["extra.weight"],
        "shape_mismatches": [{"key": "fc3.weight", "checkpoint_shape": [5, 84], "model_shape": [10, 84]}],
    }
    # the shipped checkpoint matches its own model exactly
    response = client.post("/checkpoints/inspect", json={"path": "lenet_digits.pt"}, params={"compare_to": "lenet"})
    assert response.json()["compare"] == {"missing_keys": [], "unexpected_keys": [], "shape_mismatches": []}

    response = client.post("/checkpoints/inspect", json={"path": "lenet_digits.pt"}, params={"compare_to": "nope"})
    assert response.status_code == 404


@pytest.mark.parametrize("fmt", ["pickle", "safetensors"])
def test_compare_to_reports_a_transposed_weight(client: TestClient, model_dir: Path, fmt: str) -> None:
    """[120, 84] where the model has [84, 120]: the same element count, still a shape mismatch."""
    sd = {k: v.clone() for k, v in LeNet().state_dict().items()}
    sd["fc2.weight"] = sd["fc2.weight"].t().contiguous()
    name = f"transposed.{'pt' if fmt == 'pickle' else 'safetensors'}"
    if fmt == "pickle":
        torch.save(sd, model_dir / name)
    else:
        save_file(sd, str(model_dir / name))
    response = client.post("/checkpoints/inspect", json={"path": name}, params={"compare_to": "lenet"})
    assert response.status_code == 200, response.text
    assert response.json()["compare"] == {
        "missing_keys": [],
        "unexpected_keys": [],
        "shape_mismatches": [{"key": "fc2.weight", "checkpoint_shape": [120, 84], "model_shape": [84, 120]}],
    }


def test_paths_outside_the_model_dir_are_403(client: TestClient, model_dir: Path) -> None:
    outside = model_dir.parent / "outside.pt"
    torch.save({"w": torch.ones(1)}, outside)
    link = model_dir / "link.pt"
    if not link.exists():
        link.symlink_to(outside)
    for path in ("../outside.pt", str(outside), "link.pt", "sub/../../outside.pt"):
        response = client.post("/checkpoints/inspect", json={"path": path})
        assert response.status_code == 403, (path, response.text)
        assert str(model_dir) not in response.text
    missing = client.post("/checkpoints/inspect", json={"path": "nope.pt"})
    assert missing.status_code == 404
    assert client.post("/checkpoints/inspect", json={"file": "x.pt"}).status_code == 422
    bad_json = client.post("/checkpoints/inspect", content=b"{not", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400


def test_safetensors_with_metadata(client: TestClient, model_dir: Path) -> None:
    tensors = {
        "encoder.weight": torch.randn(4, 3),
        "encoder.bias": torch.zeros(4, dtype=torch.float16),
        "bn.running_var": torch.ones(4),
        "bn.num_batches_tracked": torch.tensor(3),
    }
    save_file(tensors, str(model_dir / "w.safetensors"), metadata={"epoch": "3", "author": "test"})
    by_path = client.post("/checkpoints/inspect", json={"path": "w.safetensors"})
    assert by_path.status_code == 200, by_path.text
    by_upload = upload(client, (model_dir / "w.safetensors").read_bytes())
    assert by_upload.status_code == 200, by_upload.text
    for got in (by_path.json(), by_upload.json()):
        assert got["format"] == "safetensors"
        assert got["other"] == {"metadata": {"epoch": "3", "author": "test"}}
        assert got["optimizers"] == {}
        assert list(got["state_dicts"]) == [""]
        assert sorted(got["state_dicts"][""]["entries"], key=lambda e: e["key"]) == sorted(
            entries(tensors), key=lambda e: e["key"]
        )
        assert got["state_dicts"][""]["total_numel"] == 12 + 4 + 4 + 1

    compared = client.post("/checkpoints/inspect", json={"path": "w.safetensors"}, params={"compare_to": "lenet"})
    compare = compared.json()["compare"]
    assert sorted(compare["unexpected_keys"]) == sorted(tensors)
    assert compare["missing_keys"] == list(LeNet().state_dict())
    assert compare["shape_mismatches"] == []


@pytest.mark.parametrize("container", ["torch_zip", "plain_pickle"])
def test_malicious_pickle_is_refused_and_never_runs(client: TestClient, tmp_path: Path, container: str) -> None:
    marker = tmp_path / "pwned"
    payload = {"model_state_dict": {"w": torch.ones(2)}, "extra": Evil(marker)}
    data = to_bytes(payload) if container == "torch_zip" else pickle.dumps(payload, protocol=2)
    assert not marker.exists()

    response = upload(client, data)
    assert response.status_code == 422, response.text
    assert "refused" in response.json()["detail"]
    assert not marker.exists()

    app: Any = client.app
    (Path(app.state.hookserve.settings.model_dir) / "evil.pt").write_bytes(data)
    response = client.post("/checkpoints/inspect", json={"path": "evil.pt"}, params={"compare_to": "lenet"})
    assert response.status_code == 422
    assert not marker.exists()

    # the file is a real exploit: an unrestricted load does run it
    loaded = torch.load(io.BytesIO(data), weights_only=False) if container == "torch_zip" else pickle.loads(data)
    loaded["extra"].close()
    assert marker.exists()


@pytest.mark.parametrize(
    "data",
    [
        random.Random(0).randbytes(4096),
        b"",
        b"PK\x03\x04" + random.Random(1).randbytes(200),
        to_bytes({"w": torch.ones(3)})[:-100],
    ],
    ids=["random", "empty", "fake_zip", "truncated"],
)
def test_unreadable_files_are_400(client: TestClient, data: bytes) -> None:
    response = upload(client, data)
    assert response.status_code == 400, response.text
    assert "Traceback" not in response.text


def test_upload_over_the_limit_is_413(tmp_path: Path, make_client: ClientFactory) -> None:
    small = make_client(write_lenet(tmp_path), max_upload_bytes=1000)
    response = upload(small, os.urandom(2000))
    assert response.status_code == 413
    assert "max_upload_bytes" in response.json()["detail"]
    tiny = safetensors_save({"w": torch.ones(1)})
    assert len(tiny) < 1000 - 300  # room for the multipart envelope
    assert upload(small, tiny).status_code == 200


# ---- limits checked before anything is loaded ----------------------------------------------


@pytest.fixture
def torch_loads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every torch.load call the server makes during the test (it still loads)."""
    calls: list[object] = []
    real = torch.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    return calls


@pytest.mark.parametrize("fmt", ["torch_zip", "legacy", "safetensors"])
def test_entries_over_the_limit_are_413_before_loading(
    tmp_path: Path, make_client: ClientFactory, torch_loads: list[object], fmt: str
) -> None:
    small = make_client(write_lenet(tmp_path), max_checkpoint_entries=10)
    torch_loads.clear()  # lenet's weights

    def checkpoint(n: int) -> bytes:
        sd = {f"layer{i}.weight": torch.ones(2) for i in range(n)}
        if fmt == "safetensors":
            return safetensors_save(sd)
        buffer = io.BytesIO()
        torch.save(sd, buffer, _use_new_zipfile_serialization=fmt == "torch_zip")
        return buffer.getvalue()

    response = upload(small, checkpoint(11))
    assert response.status_code == 413, response.text
    assert "max_checkpoint_entries" in response.json()["detail"]
    assert torch_loads == []
    response = upload(small, checkpoint(4))
    assert response.status_code == 200, response.text
    assert len(response.json()["state_dicts"][""]["entries"]) == 4


def test_a_million_entries_are_refused_fast(client: TestClient, torch_loads: list[object]) -> None:
    """The issue's attack: a million entries once cost a minute of CPU and 1.7 GB before any answer."""
    data = shared_tensor_zip(1_000_000)
    assert torch.load(io.BytesIO(shared_tensor_zip(3)), weights_only=True)["w2"].tolist() == [1.0]  # a real one
    torch_loads.clear()
    started = time.perf_counter()
    response = upload(client, data)
    elapsed = time.perf_counter() - started
    assert response.status_code == 413, response.text
    assert "max_checkpoint_entries" in response.json()["detail"]
    assert torch_loads == []
    print(f"a million-entry checkpoint ({len(data) / 2**20:.0f} MiB) refused in {elapsed:.2f} s")


def test_shared_values_count_each_time_they_are_reached(client: TestClient) -> None:
    """A list holding one list twice, 40 levels down, is 80 values on disk and 2**40 once walked."""
    nested: list[Any] = [torch.ones(1)]
    for _ in range(40):
        nested = [nested, nested]
    response = upload(client, to_bytes({"history": nested}))
    assert response.status_code == 413, response.text
    assert "max_checkpoint_entries" in response.json()["detail"]


def test_nesting_deeper_than_the_limit_is_413(tmp_path: Path, make_client: ClientFactory) -> None:
    deep: dict[str, Any] = {"w": torch.ones(1)}
    for level in range(100):
        deep = {f"level{level}": deep}
    for fmt_zip in (True, False):
        buffer = io.BytesIO()
        torch.save(deep, buffer, _use_new_zipfile_serialization=fmt_zip)
        default = make_client(write_lenet(tmp_path))
        response = upload(default, buffer.getvalue())
        assert response.status_code == 413, response.text
        assert "max_checkpoint_depth" in response.json()["detail"]
    deeper = make_client(write_lenet(tmp_path), max_checkpoint_depth=200)
    response = upload(deeper, to_bytes(deep))
    assert response.status_code == 200, response.text


def test_the_scan_has_a_deadline(tmp_path: Path, make_client: ClientFactory) -> None:
    hasty = make_client(write_lenet(tmp_path), max_checkpoint_scan_s=1e-9)
    response = upload(hasty, to_bytes([float(i) for i in range(5000)]))
    assert response.status_code == 413, response.text
    assert "max_checkpoint_scan_s" in response.json()["detail"]
