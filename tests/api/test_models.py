"""GET /models and /models/{name}: every builder and weights format, INFO exactly as API.md, failure isolation."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import timm
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save_file
from timm.data.config import resolve_data_config
from torch import nn
from torchvision.models import resnet18

from service.config import Settings
from service.main import create_app
from service.zoo.lenet import LENET_INPUT_SIZE, LeNet, lenet_preprocess_spec
from tests.conftest import ClientFactory, tensor_input, wait_settled
from tests.helpers.config import toy_entry
from tests.helpers.models import PartlyFrozen

INFO_KEYS = {
    "name",
    "source",
    "architecture",
    "status",
    "error",
    "device",
    "dtype",
    "weights",
    "num_parameters",
    "trainable_parameters",
    "input_size",
    "preprocess",
    "num_classes",
    "labels",
    "optimizer",
    "hooks",
}
PREPROCESS_KEYS = {"resize", "crop", "interpolation", "mean", "std", "grayscale"}
TINY_PY = """
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.0, 1.0, 0.0]]) * scale)
            self.fc.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))
"""
LENET = 'source = "python"\narchitecture = "service.zoo.lenet:LeNet"\ninput_size = [3, 32, 32]'
# name -> (seed of the LeNet whose weights the file holds, how the file is written)
WEIGHT_FORMATS = {
    "bare": (1, "bare.pt"),
    "checkpoint": (2, "checkpoint.pt"),
    "state_dict": (3, "state_dict.pt"),
    "model": (4, "model.pt"),
    "safetensors": (5, "weights.safetensors"),
}
BROKEN = {
    "unknown-arch": "no model 'resnet19'",
    "missing-weights": "no file 'missing.pt'",
    "escaping-weights": "outside the model dir",
    "code-pickle": "refused",
    "pretrained": "downloads, which are disabled",
}
CONFIG = f"""
[[models]]
name = "tv7"
source = "torchvision"
architecture = "resnet18"
kwargs = {{ num_classes = 7 }}

[[models]]
name = "vit"
source = "timm"
architecture = "test_vit"

[[models]]
name = "py-module"
{LENET}

[[models]]
name = "py-file"
source = "python"
architecture = "nets/tiny.py:Tiny"
kwargs = {{ scale = 0.5 }}
input_size = [1, 2, 2]

[[models]]
name = "unknown-arch"
source = "torchvision"
architecture = "resnet19"

[[models]]
name = "missing-weights"
{LENET}
weights = "missing.pt"

[[models]]
name = "escaping-weights"
{LENET}
weights = "../outside.pt"

[[models]]
name = "code-pickle"
{LENET}
weights = "evil.pt"

[[models]]
name = "pretrained"
source = "torchvision"
architecture = "resnet18"
weights = "DEFAULT"
""" + "".join(
    f'\n[[models]]\nname = "{name}"\n{LENET}\nweights = "{file}"\n' for name, (_, file) in WEIGHT_FORMATS.items()
)


class Payload:
    """Unpickling this calls `open(marker, "w")`: the marker appears only if the pickle ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return open, (str(self.marker), "w")


def seeded_lenet(seed: int) -> LeNet:
    torch.manual_seed(seed)
    return LeNet().eval()


def write_weights(root: Path) -> None:
    for name, (seed, file) in WEIGHT_FORMATS.items():
        state = seeded_lenet(seed).state_dict()
        if name == "bare":
            torch.save(state, root / file)
        elif name == "checkpoint":
            model = seeded_lenet(seed)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            torch.save(
                {"model_state_dict": state, "optimizer_state_dict": optimizer.state_dict(), "epoch": 2}, root / file
            )
        elif name == "safetensors":
            save_file({k: v.contiguous() for k, v in state.items()}, str(root / file))
        else:
            torch.save({name: state, "epoch": 9}, root / file)
    torch.save(seeded_lenet(0).state_dict(), root.parent / "outside.pt")  # a real file, outside the model dir
    torch.save({"w": Payload(root / "pwned")}, root / "evil.pt")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zoo") / "models"
    (root / "nets").mkdir(parents=True)
    (root / "nets" / "tiny.py").write_text(TINY_PY)
    write_weights(root)
    (root / "models.toml").write_text(CONFIG)
    return root


@pytest.fixture(scope="module")
def client(model_dir: Path) -> Iterator[TestClient]:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the network was touched")

    settings = Settings(model_dir=model_dir, config=model_dir / "models.toml", device="cpu", worker_threads=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", no_network)
        patch.setattr(socket, "create_connection", no_network)
        with TestClient(create_app(settings)) as c:
            wait_settled(c)
            yield c


@pytest.fixture(scope="module")
def infos(client: TestClient) -> dict[str, dict[str, Any]]:
    response = client.get("/models")
    assert response.status_code == 200
    return {m["name"]: m for m in response.json()["models"]}


def num_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def logits(client: TestClient, name: str, x: torch.Tensor) -> torch.Tensor:
    response = client.post("/predict", json={"model": name, "inputs": [tensor_input(x)], "include_logits": True})
    assert response.status_code == 200, response.text
    return torch.tensor(response.json()["predictions"][0]["logits"])


# ---- INFO shape ---------------------------------------------------------------------------


def test_every_model_is_listed_in_config_order(infos: dict[str, dict[str, Any]]) -> None:
    expected = ["tv7", "vit", "py-module", "py-file", *BROKEN, *WEIGHT_FORMATS]
    assert list(infos) == expected


def test_every_info_has_every_key(infos: dict[str, dict[str, Any]]) -> None:
    for info in infos.values():
        assert set(info) >= INFO_KEYS, info["name"]
        assert "repr" not in info  # only GET /models/{name} carries the repr
        if info["status"] == "ready":
            assert set(info["preprocess"]) == PREPROCESS_KEYS
            assert info["hooks"] == 0
            assert info["error"] is None


def test_detail_adds_repr(client: TestClient, infos: dict[str, dict[str, Any]]) -> None:
    detail = client.get("/models/py-module").json()
    assert set(detail) == set(infos["py-module"]) | {"repr"}
    assert {k: v for k, v in detail.items() if k not in ("repr", "hooks")} == {
        k: v for k, v in infos["py-module"].items() if k != "hooks"
    }
    assert detail["repr"] == repr(LeNet())


def test_unknown_model_is_404(client: TestClient) -> None:
    response = client.get("/models/nope")
    assert response.status_code == 404
    assert response.json() == {"detail": "no model named 'nope'; GET /models lists them"}


# ---- builders -----------------------------------------------------------------------------


def test_torchvision_builder(client: TestClient, infos: dict[str, dict[str, Any]]) -> None:
    info = infos["tv7"]
    reference = resnet18(weights=None, num_classes=7)
    assert {k: info[k] for k in ("source", "architecture", "status", "device", "dtype", "weights")} == {
        "source": "torchvision",
        "architecture": "resnet18",
        "status": "ready",
        "device": "cpu",
        "dtype": "float32",
        "weights": "random",
    }
    assert info["num_classes"] == 7
    assert info["num_parameters"] == info["trainable_parameters"] == num_parameters(reference)
    assert info["input_size"] == [3, 224, 224]
    assert (info["labels"], info["optimizer"]) == (False, None)
    assert client.get("/models/tv7").json()["repr"] == repr(reference)


def test_timm_builder_reports_timms_data_config(client: TestClient, infos: dict[str, dict[str, Any]]) -> None:
    info = infos["vit"]
    reference = timm.create_model("test_vit")
    config = resolve_data_config({}, model=reference)  # type: ignore[no-untyped-call]
    side = config["input_size"][-1]
    assert info["status"] == "ready"
    assert info["weights"] == "random"
    assert info["input_size"] == list(config["input_size"])
    assert info["preprocess"] == {
        "resize": int(side / config["crop_pct"]),
        "crop": side,
        "interpolation": config["interpolation"],
        "mean": pytest.approx(list(config["mean"])),
        "std": pytest.approx(list(config["std"])),
        "grayscale": False,
    }
    assert info["num_classes"] == reference.num_classes
    assert info["num_parameters"] == num_parameters(reference)
    assert client.get("/models/vit").json()["repr"] == repr(reference)


def test_timm_features_only_has_no_num_classes(builtin_client: TestClient) -> None:
    info = builtin_client.get("/models/efficientvit_b0").json()
    reference = timm.create_model("efficientvit_b0", features_only=True)
    config = resolve_data_config({}, model=reference)  # type: ignore[no-untyped-call]
    assert info["status"] == "ready"
    assert info["num_classes"] is None
    assert info["weights"] == "random"
    assert info["input_size"] == list(config["input_size"])
    assert info["preprocess"]["crop"] == config["input_size"][-1]
    assert info["preprocess"]["resize"] == int(config["input_size"][-1] / config["crop_pct"])
    assert info["preprocess"]["interpolation"] == config["interpolation"] == "bicubic"
    assert info["num_parameters"] == num_parameters(reference)
    assert info["repr"] == repr(reference)


def test_python_module_builder(infos: dict[str, dict[str, Any]]) -> None:
    info = infos["py-module"]
    assert (info["status"], info["weights"], info["num_classes"]) == ("ready", "random", 10)
    assert info["num_parameters"] == num_parameters(LeNet())
    assert info["input_size"] == list(LENET_INPUT_SIZE)


def test_python_file_builder_gets_kwargs(client: TestClient, infos: dict[str, dict[str, Any]]) -> None:
    info = infos["py-file"]
    assert (info["status"], info["architecture"], info["num_classes"]) == ("ready", "nets/tiny.py:Tiny", 2)
    assert info["num_parameters"] == 10
    x = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])
    assert logits(client, "py-file", x).tolist() == [15.0, 1.0]  # 0.5 * [1+4+9+16, -1+3]


def test_builtin_lenet_info(builtin_client: TestClient) -> None:
    info = builtin_client.get("/models/lenet").json()
    assert {k: info[k] for k in ("source", "architecture", "status", "num_classes", "labels", "optimizer")} == {
        "source": "python",
        "architecture": "service.zoo.lenet:LeNet",
        "status": "ready",
        "num_classes": 10,
        "labels": True,
        "optimizer": "SGD",
    }
    assert info["weights"].endswith("lenet_digits.pt")
    assert info["preprocess"] == lenet_preprocess_spec().model_dump(mode="json")
    assert info["num_parameters"] == num_parameters(LeNet())
    assert info["repr"] == repr(LeNet())
    assert info["hooks"] == 0


def test_builtin_resnet18_is_random_and_says_so(builtin_client: TestClient) -> None:
    info = builtin_client.get("/models/resnet18").json()
    assert (info["weights"], info["num_classes"], info["optimizer"]) == ("random", 1000, None)
    assert info["repr"] == repr(resnet18(weights=None))


# ---- weights formats ----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(WEIGHT_FORMATS))
def test_weights_formats_serve_exactly_those_weights(
    client: TestClient, infos: dict[str, dict[str, Any]], name: str
) -> None:
    seed, file = WEIGHT_FORMATS[name]
    info = infos[name]
    assert info["status"] == "ready", info["error"]
    assert info["weights"] == file
    assert info["optimizer"] == ("SGD" if name == "checkpoint" else None)  # no [models.optimizer] configured
    torch.manual_seed(100)
    x = torch.randn(3, 32, 32)
    with torch.inference_mode():
        expected = seeded_lenet(seed)(x.unsqueeze(0))[0]
        others = [seeded_lenet(s)(x.unsqueeze(0))[0] for s, _ in WEIGHT_FORMATS.values() if s != seed]
    got = logits(client, name, x)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert all(not torch.allclose(got, other, atol=1e-3) for other in others)


# ---- failure isolation --------------------------------------------------------------------


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_models_fail_alone(client: TestClient, infos: dict[str, dict[str, Any]], name: str) -> None:
    info = infos[name]
    assert info["status"] == "failed"
    assert BROKEN[name] in info["error"]
    assert info["device"] is None
    assert info["hooks"] == 0
    response = client.post("/predict", json={"model": name, "inputs": [tensor_input(torch.zeros(3, 32, 32))]})
    assert response.status_code == 409
    assert f"model {name!r} is failed" in response.json()["detail"]
    assert BROKEN[name] in response.json()["detail"]


def test_failures_do_not_reveal_server_paths(infos: dict[str, dict[str, Any]], model_dir: Path) -> None:
    for name in BROKEN:
        assert str(model_dir.parent) not in infos[name]["error"]
        assert "Traceback" not in infos[name]["error"]


def test_code_in_a_pickle_never_runs(infos: dict[str, dict[str, Any]], model_dir: Path) -> None:
    assert infos["code-pickle"]["status"] == "failed"
    assert "evil.pt" in infos["code-pickle"]["error"]
    marker = model_dir / "pwned"
    assert not marker.exists()
    loaded = torch.load(model_dir / "evil.pt", weights_only=False)  # the payload is live: unsafe loading runs it
    loaded["w"].close()
    assert marker.exists()
    marker.unlink()


def test_pretrained_weights_report_default(infos: dict[str, dict[str, Any]]) -> None:
    info = infos["pretrained"]
    assert info["weights"] == "DEFAULT"
    assert "HOOKSERVE_ALLOW_DOWNLOADS" in info["error"]


def test_readyz_lists_the_failed_ones(client: TestClient) -> None:
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert set(body["models"]) == set(BROKEN)
    assert all(entry["status"] == "failed" and entry["error"] for entry in body["models"].values())


def test_a_partly_frozen_model_counts_only_its_trainable_parameters(make_client: ClientFactory) -> None:
    client = make_client(toy_entry("frozen", "PartlyFrozen"))
    info = client.get("/models/frozen").json()
    assert info["status"] == "ready", info
    assert info["num_parameters"] == PartlyFrozen.FROZEN + PartlyFrozen.TRAINABLE
    assert info["trainable_parameters"] == PartlyFrozen.TRAINABLE
    summary = client.get("/models/frozen/summary").json()
    assert (summary["trainable_params"], summary["non_trainable_params"]) == (
        PartlyFrozen.TRAINABLE,
        PartlyFrozen.FROZEN,
    )
