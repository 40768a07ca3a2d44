"""Security rules of issue 6: admin token, paths inside the model dir, no pickle code, quiet errors, CORS."""

from __future__ import annotations

import ast
import hmac
import json
import os
import platform
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastapi
import numpy as np
import pydantic
import pytest
import starlette
import torch
from fastapi.testclient import TestClient

import service
from service.config import Settings
from service.main import create_app
from tests.conftest import ClientFactory, b64, sample_png, wait_settled, write_lenet
from tests.helpers.config import toy_entry
from tests.reliability.live_server import slow_input, write_slow

ADMIN = "correct-horse-battery-staple"
SERVICE_DIR = Path(service.__file__).resolve().parent
Call = Callable[[TestClient, dict[str, str]], Any]


def _spec(name: str, architecture: str = "slow.py:Slow", **extra: Any) -> dict[str, Any]:
    return {"name": name, "source": "python", "architecture": architecture, "input_size": [1, 4, 4], **extra}


ADMIN_CALLS: dict[str, Call] = {
    "POST /models": lambda c, h: c.post("/models", json=_spec("slow2"), headers=h),
    "DELETE /models/{name}": lambda c, h: c.delete("/models/slow", headers=h),
    "POST /v2/repository/models/{m}/unload": lambda c, h: c.post("/v2/repository/models/slow/unload", headers=h),
    "POST /v2/repository/models/{m}/load": lambda c, h: c.post("/v2/repository/models/slow/load", headers=h),
}


def _message(response: Any) -> str:
    body = response.json()
    return str(body.get("detail", body.get("error")))


# ---- admin token -------------------------------------------------------------------------


@pytest.mark.parametrize("call", ADMIN_CALLS.values(), ids=ADMIN_CALLS.keys())
def test_admin_calls_are_disabled_without_a_configured_token(
    make_client: ClientFactory, tmp_path: Path, call: Call
) -> None:
    client = make_client(write_slow(tmp_path))
    for headers in ({}, {"Authorization": "Bearer anything"}, {"Authorization": "Bearer "}):
        r = call(client, headers)
        assert r.status_code == 403, r.text
        assert "disabled" in _message(r)
    assert client.get("/models/slow").json()["status"] == "ready"  # nothing happened
    assert "slow2" not in {m["name"] for m in client.get("/models").json()["models"]}


@pytest.mark.parametrize("call", ADMIN_CALLS.values(), ids=ADMIN_CALLS.keys())
def test_admin_calls_need_the_right_bearer_token(make_client: ClientFactory, tmp_path: Path, call: Call) -> None:
    client = make_client(write_slow(tmp_path), admin_token=ADMIN)
    for headers in (
        {},
        {"Authorization": ADMIN},
        {"Authorization": f"Basic {ADMIN}"},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {ADMIN}x"},
        {"Authorization": f"Bearer {ADMIN[:-1]}"},
    ):
        r = call(client, headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["WWW-Authenticate"] == "Bearer"
    assert client.get("/models/slow").json()["status"] == "ready"
    r = call(client, {"Authorization": f"Bearer {ADMIN}"})
    assert 200 <= r.status_code < 300, r.text


def test_admin_round_trip(make_client: ClientFactory, tmp_path: Path) -> None:
    client = make_client(write_slow(tmp_path), admin_token=ADMIN)
    headers = {"Authorization": f"Bearer {ADMIN}"}
    assert client.post("/models", json=_spec("slow2"), headers=headers).status_code == 202
    wait_settled(client)
    assert client.get("/models/slow2").json()["status"] == "ready"
    assert client.delete("/models/slow2", headers=headers).status_code == 200
    assert client.post("/v2/repository/models/slow/unload", headers=headers).status_code == 200
    assert client.get("/models/slow").status_code == 404
    assert client.post("/v2/repository/models/slow/load", headers=headers).status_code == 200
    assert client.get("/models/slow").json()["status"] == "ready"


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "beaRer"])
def test_the_bearer_scheme_matches_whatever_its_case(make_client: ClientFactory, tmp_path: Path, scheme: str) -> None:
    """HTTP auth schemes are case-insensitive (RFC 9110 11.1): `bearer <token>` is the admin as much as `Bearer`."""
    client = make_client(write_slow(tmp_path), admin_token=ADMIN)
    assert client.delete("/models/nope", headers={"Authorization": f"{scheme} wrong"}).status_code == 401
    r = client.delete("/models/slow", headers={"Authorization": f"{scheme} {ADMIN}"})
    assert r.status_code == 200, r.text
    assert client.get("/models/slow").status_code == 404  # it did unload


def test_token_is_compared_in_constant_time(
    make_client: ClientFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[object, object]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr("service.dataplane.admin.hmac.compare_digest", spy)
    client = make_client(write_slow(tmp_path), admin_token=ADMIN)
    assert client.delete("/models/nope", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.delete("/models/nope", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 404
    assert calls == [(b"wrong", ADMIN.encode()), (ADMIN.encode(), ADMIN.encode())]


def test_python_models_cannot_come_from_a_non_admin(make_client: ClientFactory, tmp_path: Path) -> None:
    """A python-class spec in a request body runs nothing unless the admin token is right."""
    marker = tmp_path / "ran"
    (tmp_path / "payload.py").write_text(f"open({str(marker)!r}, 'w').close()\nfrom slow import *\n")
    config = write_slow(tmp_path)
    spec = _spec("payload", "payload.py:Slow")
    config_param = {"parameters": {"config": json.dumps(spec)}}
    for token in (None, ADMIN):
        client = make_client(config, admin_token=token)
        for headers in ({}, {"Authorization": "Bearer nope"}):
            assert client.post("/models", json=spec, headers=headers).status_code in (401, 403)
            r = client.post("/v2/repository/models/payload/load", json=config_param, headers=headers)
            assert r.status_code in (401, 403)
    assert not marker.exists()


# ---- server-side paths -------------------------------------------------------------------


@pytest.fixture
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory beside (not under) the model dir, holding files a client must never reach."""
    root = tmp_path_factory.mktemp("outside")
    marker = root / "ran"
    (root / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nfrom torch import nn\n\nclass Evil(nn.Linear):\n"
        "    def __init__(self):\n        super().__init__(16, 2)\n"
    )
    torch.save({"body.weight": torch.zeros(3, 16), "body.bias": torch.zeros(3)}, root / "weights.pt")
    (root / "labels.txt").write_text("a\nb\nc\n")
    return root


def test_request_paths_outside_the_model_dir_are_403(make_client: ClientFactory, tmp_path: Path, outside: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "inside.pt")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.pt").symlink_to(outside / "weights.pt")
    (tmp_path / "sub" / "dirlink").symlink_to(outside, target_is_directory=True)
    client = make_client(None)
    for path in (
        "../" + outside.name + "/weights.pt",
        "sub/../../" + outside.name + "/weights.pt",
        str(outside / "weights.pt"),
        str(tmp_path / "inside.pt"),  # absolute, even pointing inside
        "link.pt",
        "sub/dirlink/weights.pt",
        "/etc/passwd",
    ):
        r = client.post("/checkpoints/inspect", json={"path": path})
        assert r.status_code == 403, (path, r.text)
        assert str(outside) not in r.text
        assert str(tmp_path) not in r.text
    assert client.post("/checkpoints/inspect", json={"path": "sub/../inside.pt"}).status_code == 200
    assert client.post("/checkpoints/inspect", json={"path": "nope.pt"}).status_code == 404


def test_config_paths_outside_the_model_dir_fail_the_model(
    make_client: ClientFactory, tmp_path: Path, outside: Path
) -> None:
    (tmp_path / "wlink.pt").symlink_to(outside / "weights.pt")
    (tmp_path / "evil_link.py").symlink_to(outside / "evil.py")
    up = f"../{outside.name}"
    cases = {
        "w_dotdot": f'architecture = "slow.py:Slow"\nweights = "{up}/weights.pt"',
        "w_abs": f'architecture = "slow.py:Slow"\nweights = "{outside / "weights.pt"}"',
        "w_link": 'architecture = "slow.py:Slow"\nweights = "wlink.pt"',
        "l_dotdot": f'architecture = "slow.py:Slow"\nlabels = "{up}/labels.txt"',
        "l_abs": f'architecture = "slow.py:Slow"\nlabels = "{outside / "labels.txt"}"',
        "py_dotdot": f'architecture = "{up}/evil.py:Evil"',
        "py_abs": f'architecture = "{outside / "evil.py"}:Evil"',
        "py_link": 'architecture = "evil_link.py:Evil"',
    }
    config = write_slow(tmp_path) + "".join(
        f'\n[[models]]\nname = "{name}"\nsource = "python"\ninput_size = [1, 4, 4]\n{body}\n'
        for name, body in cases.items()
    )
    client = make_client(config, admin_token=ADMIN)
    infos = {m["name"]: m for m in client.get("/models").json()["models"]}
    for name in cases:
        info = infos[name]
        assert info["status"] == "failed", (name, info)
        assert "outside the model dir" in info["error"] or "absolute paths are refused" in info["error"], info
        assert str(outside) not in info["error"]
        assert str(tmp_path) not in info["error"]
    # An admin gets no further than the config file did.
    headers = {"Authorization": f"Bearer {ADMIN}"}
    r = client.post("/models", json=_spec("admin_escape", f"{up}/evil.py:Evil"), headers=headers)
    assert r.status_code == 202
    wait_settled(client)
    info = client.get("/models/admin_escape").json()
    assert info["status"] == "failed"
    assert "outside the model dir" in info["error"]
    assert infos["slow"]["status"] == "ready"
    assert not (outside / "ran").exists()


def _from_file(name: str, source: str = "python", **kwargs: Any) -> dict[str, Any]:
    """A model whose builder reads the file its kwargs name (`tests.helpers.models:FromFile`, or timm's)."""
    architecture = "tests.helpers.models:FromFile" if source == "python" else "resnet18"
    return {"name": name, "source": source, "architecture": architecture, "input_size": [4], "kwargs": kwargs}


def test_path_kwargs_outside_the_model_dir_are_403(make_client: ClientFactory, tmp_path: Path, outside: Path) -> None:
    """timm's checkpoint_path and the like name files: they stay under the model dir, as weights do."""
    (outside / "offset.txt").write_text("7")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "offset.txt").write_text("5")
    client = make_client(write_slow(tmp_path), admin_token=ADMIN)
    headers = {"Authorization": f"Bearer {ADMIN}"}
    escapes = (str(outside / "offset.txt"), f"../{outside.name}/offset.txt", f"sub/../../{outside.name}/offset.txt")
    specs = [_from_file("escape", offset_file=path) for path in escapes]
    specs += [_from_file("escape", offset_file="sub/offset.txt", options={"file": path}) for path in escapes]
    specs += [_from_file("escape", "timm", checkpoint_path=str(outside / "weights.pt"))]
    specs += [_from_file("escape", "timm", pretrained_cfg_overlay={"file": f"../{outside.name}/weights.pt"})]
    for spec in specs:
        r = client.post("/models", json=spec, headers=headers)
        assert r.status_code == 403, (spec, r.text)
        assert "absolute paths are refused" in _message(r) or "outside the model dir" in _message(r), r.text
        assert "kwargs." in _message(r)
        assert str(outside) not in r.text
        config = {"parameters": {"config": json.dumps(spec)}}
        r = client.post("/v2/repository/models/escape/load", json=config, headers=headers)
        assert r.status_code == 403, (spec, r.text)
    assert "escape" not in {m["name"] for m in client.get("/models").json()["models"]}

    # No oracle: the answer is the same whether the outside file is there or not.
    for path in escapes:
        there = client.post("/models", json=_from_file("escape", offset_file=path), headers=headers)
        (outside / "offset.txt").unlink()
        gone = client.post("/models", json=_from_file("escape", offset_file=path), headers=headers)
        (outside / "offset.txt").write_text("7")
        assert (there.status_code, there.json()) == (gone.status_code, gone.json())

    r = client.post("/models", json=_from_file("inside", offset_file="sub/offset.txt"), headers=headers)
    assert r.status_code == 202, r.text
    wait_settled(client)
    assert client.get("/models/inside").json()["status"] == "ready"
    answer = client.post(
        "/predict",
        json={"model": "inside", "inputs": [{"tensor": {"shape": [4], "data": [0, 1, 2, 3]}}], "include_logits": True},
    )
    assert answer.json()["predictions"][0]["logits"] == [5.0, 6.0, 7.0, 8.0]


def test_path_kwargs_in_the_config_fail_the_model(make_client: ClientFactory, tmp_path: Path, outside: Path) -> None:
    (outside / "offset.txt").write_text("7")
    (tmp_path / "offset.txt").write_text("5")
    cases = {
        "k_abs": {"offset_file": str(outside / "offset.txt")},
        "k_dotdot": {"offset_file": f"../{outside.name}/offset.txt"},
        "k_nested": {"offset_file": "offset.txt", "options": {"cache_dir": f"../{outside.name}"}},
        "k_inside": {"offset_file": "offset.txt"},
    }
    config = "".join(toy_entry(name, "FromFile", kwargs=kwargs) for name, kwargs in cases.items())
    client = make_client(config)
    infos = {m["name"]: m for m in client.get("/models").json()["models"]}
    assert infos["k_inside"]["status"] == "ready", infos["k_inside"]
    for name in ("k_abs", "k_dotdot", "k_nested"):
        info = infos[name]
        assert info["status"] == "failed", (name, info)
        assert "outside the model dir" in info["error"] or "absolute paths are refused" in info["error"], info
        assert "kwargs." in info["error"]
        assert str(outside) not in info["error"]


# ---- pickles -----------------------------------------------------------------------------


def _calls(tree: ast.AST, names: set[str]) -> list[ast.Call]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            dotted = ast.unparse(func)
            if dotted in names:
                found.append(node)
    return found


def _keyword(call: ast.Call, name: str) -> object:
    for kw in call.keywords:
        if kw.arg == name and isinstance(kw.value, ast.Constant):
            return kw.value.value
    return None


TORCHSCRIPT_SOURCE = "service/registry/sources/torchscript.py"


def test_every_load_in_the_service_refuses_pickled_code() -> None:
    """torch.load only with weights_only=True, np.load only with allow_pickle=False, and no raw unpickling."""
    torch_loads = 0
    for path in sorted(SERVICE_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(SERVICE_DIR.parent)
        for call in _calls(tree, {"torch.load"}):
            torch_loads += 1
            assert _keyword(call, "weights_only") is True, f"{where}:{call.lineno} torch.load without weights_only=True"
        for call in _calls(tree, {"np.load", "numpy.load"}):
            assert _keyword(call, "allow_pickle") is False, f"{where}:{call.lineno} np.load may unpickle"
        raw = _calls(tree, {"pickle.load", "pickle.loads", "pickle.Unpickler", "dill.load"})
        assert not raw, f"{where}:{raw[0].lineno} unpickles without a safe loader"
        programs = _calls(tree, {"torch.jit.load"})
        if str(where) == TORCHSCRIPT_SOURCE:
            # the one program loader: a TorchScript archive an operator put under the model dir, named by an
            # admin-only model spec, and never a file that came with a request
            assert "resolve_under(model_dir" in path.read_text()
            continue
        assert not programs, f"{where}:{programs[0].lineno} loads a TorchScript program outside the model-dir source"
    assert torch_loads >= 2  # weights files and /checkpoints/inspect: the scan did find them


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def test_pickles_that_need_code_are_refused_and_never_run(make_client: ClientFactory, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    torch.save({"model_state_dict": {"w": _Evil(marker)}}, tmp_path / "evil.pt")
    client = make_client(None)
    r = client.post("/checkpoints/inspect", files={"file": ("evil.pt", (tmp_path / "evil.pt").read_bytes())})
    assert r.status_code == 422
    assert "arbitrary code" in r.json()["detail"]
    r = client.post("/checkpoints/inspect", json={"path": "evil.pt"})
    assert r.status_code == 422
    assert not marker.exists()


# ---- error bodies ------------------------------------------------------------------------


def _leaks(tmp_path: Path) -> list[str]:
    versions = {
        torch.__version__,
        fastapi.__version__,
        starlette.__version__,
        pydantic.VERSION,
        np.__version__,
        platform.python_version(),
    }
    return [
        "Traceback",
        'File "',
        "site-packages",
        "errors.pydantic.dev",
        str(tmp_path),
        str(SERVICE_DIR),
        sys.prefix,
        *versions,
    ]


def _png_truncated() -> bytes:
    data = sample_png(1)
    return data[: len(data) // 2]


BAD_REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/predict", {"content": b"{not json", "headers": {"content-type": "application/json"}}),
    ("POST", "/predict", {"content": b"", "headers": {"content-type": "application/json"}}),
    ("POST", "/predict", {"json": {"model": "nope", "inputs": [{"image": "AAAA"}]}}),
    ("POST", "/predict", {"json": {"model": "lenet", "inputs": [{"image": "!!notbase64!!"}]}}),
    ("POST", "/predict", {"json": {"model": "lenet", "inputs": [{"image": b64(b"not an image")}]}}),
    ("POST", "/predict", {"json": {"model": "lenet", "inputs": [{"image": b64(_png_truncated())}]}}),
    ("POST", "/predict", {"json": {"model": "lenet", "inputs": [{"tensor": {"shape": [3, 2], "data": [1] * 6}}]}}),
    ("POST", "/predict", {"json": {"model": "lenet", "inputs": [{"tensor": {"shape": [9] * 8, "data": [1]}}]}}),
    (
        "POST",
        "/predict",
        {"json": {"model": "lenet", "inputs": [{"tensor": {"shape": [3], "dtype": "q", "data": [0]}}]}},
    ),
    (
        "POST",
        "/predict",
        {"json": {"model": "lenet", "inputs": [{"tensor": {"shape": [3, 32, 32], "b64": b64(struct.pack("<f", 1))}}]}},
    ),
    (
        "POST",
        "/predict",
        {
            "json": {
                "model": "slow",
                "inputs": [{"tensor": {"shape": [1, 4, 4], "b64": b64(np.full(16, np.nan, "<f4").tobytes())}}],
            }
        },
    ),
    ("POST", "/predict", {"json": {"model": "lenet", "inputs": [{"image": "AAAA", "tensor": {"shape": [1]}}]}}),
    ("POST", "/predict", {"json": {"model": 5, "inputs": "x", "top_k": -1, "extra": True}}),
    ("POST", "/predict", {"data": {"model": "lenet"}}),
    ("POST", "/predict", {"content": b"--X\r\nbroken", "headers": {"content-type": "multipart/form-data; boundary=X"}}),
    ("POST", "/activations", {"json": {"model": "lenet", "inputs": [{"image": b64(sample_png(1))}], "layers": ["x"]}}),
    (
        "POST",
        "/activations",
        {"json": {"model": "lenet", "inputs": [{"image": b64(sample_png(1))}], "layers": ["fc3"], "format": "png"}},
    ),
    ("POST", "/gradients", {"json": {"model": "lenet", "inputs": [{"image": b64(sample_png(1))}], "target": "cat"}}),
    ("POST", "/gradients", {"json": {"model": "lenet", "inputs": [{"image": b64(sample_png(1))}], "target": 99}}),
    (
        "POST",
        "/saliency",
        {"json": {"model": "lenet", "inputs": [{"image": b64(sample_png(1))}], "method": "gradcam", "layer": "fc3"}},
    ),
    ("POST", "/saliency", {"json": {"model": "lenet", "inputs": [{"image": b64(sample_png(1))}], "method": "nope"}}),
    ("POST", "/predict", {"json": {"model": "slow", "inputs": [slow_input(-7.0)]}}),
    ("GET", "/models/nope", {}),
    ("GET", "/models/lenet/state-dict?key=nope&format=npy", {}),
    ("GET", "/models/lenet/state-dict?format=npy", {}),
    ("GET", "/models/lenet/summary?input_size=a,b", {}),
    ("GET", "/models/lenet/summary?input_size=1,3,2,2", {}),
    ("GET", "/models/slow/optimizer", {}),
    ("POST", "/predict", {"json": {"model": "broken", "inputs": [slow_input()]}}),
    ("POST", "/checkpoints/inspect", {"files": {"file": ("x.pt", b"garbage" * 100)}}),
    ("POST", "/checkpoints/inspect", {"files": {"file": ("x.pt", b"PK\x03\x04" + b"\x00" * 100)}}),
    ("POST", "/checkpoints/inspect", {"json": {"path": "../../etc/passwd"}}),
    ("POST", "/checkpoints/inspect", {"json": {"path": "missing.pt"}}),
    ("POST", "/checkpoints/inspect?compare_to=nope", {"files": {"file": ("x.pt", b"garbage")}}),
    ("POST", "/models", {"json": {"name": "x"}}),
    ("DELETE", "/models/lenet", {}),
    ("GET", "/no/such/path", {}),
    ("PUT", "/predict", {}),
    ("POST", "/v2/models/lenet/infer", {"content": b"{bad", "headers": {"content-type": "application/json"}}),
    ("POST", "/v2/models/lenet/infer", {"json": {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}}),
    ("POST", "/v2/models/lenet/infer", {"content": b"xx", "headers": {"Inference-Header-Content-Length": "999"}}),
    ("POST", "/v2/models/lenet/infer", {"content": b"\x00\x01", "headers": {"Content-Encoding": "gzip"}}),
    ("GET", "/v2/models/nope", {}),
    ("GET", "/v2/models/lenet/versions/7", {}),
    ("POST", "/v2/repository/models/lenet/load", {}),
]


def test_no_error_body_reveals_tracebacks_paths_or_versions(make_client: ClientFactory, tmp_path: Path) -> None:
    config = write_lenet(tmp_path) + write_slow(tmp_path)
    config += '\n[[models]]\nname = "broken"\nsource = "python"\narchitecture = "missing.py:Gone"\n'
    client = make_client(config)
    leaks = _leaks(tmp_path)
    statuses = []
    for method, url, kwargs in BAD_REQUESTS:
        r = client.request(method, url, **kwargs)
        statuses.append(r.status_code)
        assert 400 <= r.status_code < 600, (method, url, r.status_code, r.text)
        assert r.status_code != 500, (method, url, r.text)
        text = r.text
        assert r.headers["content-type"].startswith("application/json"), (url, r.headers)
        found = [leak for leak in leaks if leak in text]
        assert not found, (method, url, found, text)
    assert {400, 403, 404, 405, 409, 422, 503} <= set(statuses)  # the battery covers every kind
    info = client.get("/models/broken").json()  # a failed model's INFO is as quiet
    assert info["status"] == "failed"
    assert not [leak for leak in leaks if leak in str(info)]


def test_an_unexpected_server_error_says_nothing_about_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import service.dataplane.inference as predict_module

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"internal failure in {SERVICE_DIR} with torch {torch.__version__}")

    monkeypatch.setattr(predict_module, "top_k_predictions", boom)
    (tmp_path / "models.toml").write_text(write_slow(tmp_path))
    settings = Settings(model_dir=tmp_path, config=tmp_path / "models.toml", worker_threads=1)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        wait_settled(client)
        r = client.post("/predict", json={"model": "slow", "inputs": [slow_input()]})
        v2 = client.post("/v2/models/slow/infer", json={"inputs": []})
    assert r.status_code == 500
    assert r.json() == {"detail": "internal server error; the server log has the details"}
    assert not [leak for leak in _leaks(tmp_path) if leak in r.text + v2.text]


# ---- CORS --------------------------------------------------------------------------------

PREFLIGHT = {"Origin": "https://ui.example", "Access-Control-Request-Method": "POST"}


def test_cors_is_off_by_default(make_client: ClientFactory) -> None:
    client = make_client(None)
    r = client.options("/predict", headers=PREFLIGHT)
    assert "access-control-allow-origin" not in r.headers
    r = client.get("/healthz", headers={"Origin": "https://ui.example"})
    assert r.status_code == 200
    assert "access-control-allow-origin" not in r.headers


def test_cors_is_on_for_the_configured_origins(make_client: ClientFactory) -> None:
    client = make_client(None, cors_origins=["https://ui.example"], max_body_bytes=1000)
    r = client.options("/predict", headers=PREFLIGHT)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://ui.example"
    assert "POST" in r.headers["access-control-allow-methods"]
    r = client.options("/predict", headers=PREFLIGHT | {"Origin": "https://evil.example"})
    assert r.headers.get("access-control-allow-origin") != "https://evil.example"
    r = client.get("/healthz", headers={"Origin": "https://ui.example"})
    assert r.headers["access-control-allow-origin"] == "https://ui.example"
    # A browser can read why its request was refused: the 413 of the body limit carries CORS too.
    r = client.post("/predict", content=b"x" * 2000, headers={"Origin": "https://ui.example"})
    assert r.status_code == 413
    assert r.headers["access-control-allow-origin"] == "https://ui.example"


def test_admin_load_checks_the_token_before_reading_the_body(make_client: ClientFactory) -> None:
    client = make_client(None, admin_token="s3cret")
    for body in (b"{not json", b'{"name": "x"}', b'{"name": "ok", "source": "python", "architecture": "a:B"}'):
        r = client.post("/models", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 401, (body, r.text)
    assert client.post("/models", content=b"{not json", headers={"Authorization": "Bearer s3cret"}).status_code == 400
    schema = client.app.openapi()["paths"]["/models"]["post"]["requestBody"]["content"]["application/json"]  # type: ignore[attr-defined]
    assert schema["schema"]["$ref"].endswith("/LoadModelRequest")
