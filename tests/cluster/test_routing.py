"""Which model a request names: path, query parameter, JSON body or multipart form (as curl sends it)."""

from __future__ import annotations

import httpx
import pytest

from service.cluster.messages import ForwardRequest
from service.cluster.routing import is_admin, model_of


def request(method: str, url: str, **kwargs: object) -> ForwardRequest:
    """What the router would read from this httpx request."""
    built = httpx.Request(method, f"http://h{url}", **kwargs)  # type: ignore[arg-type]
    return ForwardRequest(
        method,
        built.url.path,
        built.url.query,
        [(k.lower(), v) for k, v in built.headers.raw],
        built.read(),
    )


@pytest.mark.parametrize(
    ("method", "url", "model"),
    [
        ("GET", "/models/lenet", "lenet"),
        ("GET", "/models/resnet18/state-dict?stats=true", "resnet18"),
        ("GET", "/v2/models/lenet", "lenet"),
        ("POST", "/v2/models/lenet/versions/1/infer", "lenet"),
        ("POST", "/v2/repository/models/lenet/load", "lenet"),
        ("POST", "/checkpoints/inspect?compare_to=resnet18", "resnet18"),
        ("GET", "/models", None),
        ("GET", "/readyz", None),
        ("POST", "/checkpoints/inspect", None),
    ],
)
def test_model_in_path_and_query(method: str, url: str, model: str | None) -> None:
    assert model_of(request(method, url)) == model


def test_model_in_json_body() -> None:
    assert model_of(request("POST", "/predict", json={"model": "lenet", "inputs": []})) == "lenet"
    assert model_of(request("POST", "/saliency", json={"inputs": [{"model": "x"}]})) is None  # top level only
    assert model_of(request("POST", "/predict", json={"model": 7})) is None
    assert model_of(request("POST", "/predict", json=["model"])) is None
    bad = request("POST", "/predict", content=b"{nope", headers={"content-type": "application/json"})
    assert model_of(bad) is None


def test_model_in_multipart_form_wherever_the_field_is() -> None:
    image = ("d.png", b"\x89PNG" + b"x" * 300_000, "image/png")
    first = request("POST", "/predict", data={"model": "lenet", "top_k": "3"}, files={"image": image})
    assert model_of(first) == "lenet"
    # httpx writes data fields before files; a hand-made form may put the model last
    boundary = "b0undary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="d.png"\r\n'
        f"Content-Type: image/png\r\n\r\n".encode()
        + b"\x00" * 200_000
        + f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nresnet18\r\n'
        f"--{boundary}--\r\n".encode()
    )
    last = request(
        "POST", "/activations", content=body, headers={"content-type": f"multipart/form-data; boundary={boundary}"}
    )
    assert model_of(last) == "resnet18"
    garbage = request(
        "POST", "/predict", content=b"not a form", headers={"content-type": "multipart/form-data; boundary=x"}
    )
    assert model_of(garbage) is None
    assert model_of(request("POST", "/predict", files={"image": image})) is None


@pytest.mark.parametrize(
    ("method", "path", "admin"),
    [
        ("POST", "/models", True),
        ("DELETE", "/models/lenet", True),
        ("POST", "/v2/repository/models/lenet/load", True),
        ("POST", "/v2/repository/models/lenet/unload", True),
        ("GET", "/models", False),
        ("GET", "/models/lenet", False),
        ("POST", "/v2/repository/index", False),
        ("POST", "/predict", False),
    ],
)
def test_admin_calls(method: str, path: str, admin: bool) -> None:
    assert is_admin(method, path) is admin
