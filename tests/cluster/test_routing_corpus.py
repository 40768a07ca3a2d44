"""The router reads bodies as the app does: one request corpus, sent to one process and through the router.

One process serves `lenet` and `lenet2`; behind the router the same models are split into two
groups (`digits`: lenet first, `more`: lenet2), each its own in-process app as a replica hosts it.
Every request of the corpus names `lenet2` (or nothing, or a model nobody serves) in a different
way: the content types curl and scripts send, forms in odd shapes, paths and queries. A request
the router read differently from the app would reach `digits`, which has no `lenet2`: a 404
where one process answers 200. So each answer through the router must equal one process's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from service.cluster.asgi_host import AppHost
from service.cluster.messages import ForwardRequest, ForwardResponse
from service.cluster.router import Group, RouterApp, RouterSettings
from service.config import Settings
from service.main import create_app
from tests.conftest import sample_png, write_lenet

ZEROS = {"tensor": {"shape": [3, 32, 32], "dtype": "float32", "data": [0.0] * 3072}}
PNG = sample_png(7)


def form(*parts: tuple[str, bytes, str | None], boundary: str = "c0rpus") -> bytes:
    """A multipart body with the parts in the order given: (name, value, filename or None)."""
    out = b""
    for name, value, filename in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        kind = "Content-Type: image/png\r\n" if filename else ""
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n{kind}\r\n".encode() + value + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def json_body(**fields: Any) -> bytes:
    return orjson.dumps(fields)


def typed(content_type: str | None) -> dict[str, str]:
    return {} if content_type is None else {"content-type": content_type}


MP = "multipart/form-data; boundary=c0rpus"
J = typed("application/json")
LENET2 = json_body(model="lenet2", inputs=[ZEROS])
IMAGE = ("image", PNG, "d.png")
MODEL2 = ("model", b"lenet2", None)
V2_INPUT = {"name": "input__0", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [0.0] * 3072}
CHECKPOINT = json_body(path="lenet_digits.pt")
CORPUS: list[tuple[str, str, str, dict[str, str], bytes]] = [
    # (case, method, path, headers, body)
    ("json", "POST", "/predict", J, LENET2),
    ("json+charset", "POST", "/predict", typed("application/json; charset=utf-8"), LENET2),
    ("json upper-case type", "POST", "/predict", typed("APPLICATION/JSON"), LENET2),
    ("json as text/plain", "POST", "/predict", typed("text/plain"), LENET2),
    ("json as octet-stream", "POST", "/activations", typed("application/octet-stream"),
     json_body(model="lenet2", inputs=[ZEROS], layers=["fc3"], format="stats")),
    ("json with no type", "POST", "/predict", typed(None), LENET2),
    ("json as a urlencoded form", "POST", "/predict", typed("application/x-www-form-urlencoded"), LENET2),
    ("json +json type", "POST", "/gradients", typed("application/vnd.api+json"),
     json_body(model="lenet2", inputs=[ZEROS], layers=["conv1"])),
    ("json model repeated", "POST", "/predict", J, b'{"model": "lenet", "model": "lenet2", "inputs": []}'),
    ("json model not a string", "POST", "/predict", J, json_body(model=7, inputs=[ZEROS])),
    ("json unknown model", "POST", "/predict", J, json_body(model="nope", inputs=[ZEROS])),
    ("json unknown model, bad body", "POST", "/predict", J, json_body(model="nope")),
    ("json no model", "POST", "/predict", J, json_body(inputs=[ZEROS])),
    ("json nested model only", "POST", "/predict", J, json_body(inputs=[{"model": "lenet2"}])),
    ("json array", "POST", "/predict", J, b'["lenet2"]'),
    ("not json", "POST", "/predict", J, b"{nope"),
    ("not utf-8", "POST", "/predict", typed("text/plain"), b'{"model": "lenet2\xff"}'),
    ("empty", "POST", "/predict", J, b""),
    ("form", "POST", "/predict", typed(MP), form(MODEL2, IMAGE)),
    ("form model last", "POST", "/predict", typed(MP), form(IMAGE, ("top_k", b"2", None), MODEL2)),
    ("form upper-case type", "POST", "/predict", typed("Multipart/Form-Data; boundary=c0rpus"), form(MODEL2, IMAGE)),
    ("form latin-1 charset", "POST", "/predict", typed(MP + "; charset=latin-1"), form(MODEL2, IMAGE)),
    ("form model twice", "POST", "/predict", typed(MP), form(MODEL2, ("model", b"lenet", None), IMAGE)),
    ("form model padded", "POST", "/predict", typed(MP), form(("model", b" lenet2", None), IMAGE)),
    ("form model as a file", "POST", "/predict", typed(MP), form(("model", b"lenet2", "m.txt"), IMAGE)),
    ("form no model", "POST", "/predict", typed(MP), form(IMAGE)),
    ("form unknown model", "POST", "/predict", typed(MP), form(("model", b"nope", None), IMAGE)),
    ("form no boundary", "POST", "/predict", typed("multipart/form-data"), form(MODEL2)),
    ("form saliency", "POST", "/saliency", typed(MP), form(MODEL2, ("method", b"gradcam", None), IMAGE)),
    ("path", "GET", "/models/lenet2", {}, b""),
    ("path unknown", "GET", "/models/nope/layers", {}, b""),
    ("v2 path", "GET", "/v2/models/lenet2", {}, b""),
    ("v2 infer", "POST", "/v2/models/lenet2/infer", J, json_body(inputs=[V2_INPUT])),
    ("query", "POST", "/checkpoints/inspect?compare_to=lenet2", J, CHECKPOINT),
    ("query unknown", "POST", "/checkpoints/inspect?compare_to=nope", J, CHECKPOINT),
]  # fmt: skip


def _toml(model_dir: Path, names: list[str]) -> Path:
    path = model_dir / f"{'-'.join(names)}.toml"
    path.write_text("".join(write_lenet(model_dir, name) for name in names))
    return path


def _request(method: str, path: str, headers: dict[str, str], body: bytes) -> ForwardRequest:
    target, _, query = path.partition("?")
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    return ForwardRequest(method, target, query.encode(), [*raw, (b"content-length", str(len(body)).encode())], body)


async def _settled(host: AppHost) -> None:
    for _ in range(1200):
        models = orjson.loads((await host.call(ForwardRequest("GET", "/models"))).body)["models"]
        if all(m["status"] != "loading" for m in models):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("models still loading")


def _comparable(answer: ForwardResponse | httpx.Response) -> tuple[int, Any]:
    """Status and JSON body; for a 200 the model and its top classes (the floats are compared elsewhere)."""
    status = answer.status if isinstance(answer, ForwardResponse) else answer.status_code
    body = orjson.loads(answer.body if isinstance(answer, ForwardResponse) else answer.content)
    if status == 200 and "predictions" in body:
        body = {"model": body["model"], "top": [[t["index"] for t in p["top_k"]] for p in body["predictions"]]}
    if status == 200 and "results" in body:
        body = {"model": body["model"], "targets": [r["target"] for r in body["results"]]}
    if status == 200 and "activations" in body:
        body = {"model": body["model"], "layers": sorted(body["activations"])}
    if isinstance(body, dict):
        body.pop("load_seconds", None)  # how long this copy took to load
    return status, body


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, tuple[int, Any], tuple[int, Any]]]:
    model_dir = tmp_path_factory.mktemp("corpus")

    def app(names: list[str]) -> AppHost:
        config = _toml(model_dir, names)
        settings = Settings(
            model_dir=model_dir, config=config, worker_threads=1, cpu_threads=1, torch_threads=1, decode_threads=1
        )
        return AppHost(create_app(settings))

    async def scenario() -> list[tuple[str, tuple[int, Any], tuple[int, Any]]]:
        one, groups = app(["lenet", "lenet2"]), {"digits": app(["lenet"]), "more": app(["lenet2"])}
        hosts = [one, *groups.values()]
        for host in hosts:
            await host.start()
        try:
            for host in hosts:
                await _settled(host)

            async def send(group: str, request: ForwardRequest) -> ForwardResponse:
                return await groups[group].call(request)

            settings = RouterSettings(admin_token=None, max_body_bytes=32 << 20, max_upload_bytes=32 << 20)
            router = RouterApp([Group("digits", ("lenet",)), Group("more", ("lenet2",))], send, settings)
            out = []
            transport = httpx.ASGITransport(app=router)
            async with httpx.AsyncClient(transport=transport, base_url="http://cluster") as through_router:
                for case, method, path, headers, body in CORPUS:
                    want = await one.call(_request(method, path, headers, body))
                    got = await through_router.request(method, path, headers=headers, content=body)
                    out.append((case, _comparable(want), _comparable(got)))
            return out
        finally:
            for host in hosts:
                await host.stop()

    return asyncio.run(scenario())


@pytest.mark.parametrize("case", [c[0] for c in CORPUS])
def test_the_router_answers_as_one_process_does(
    answers: list[tuple[str, tuple[int, Any], tuple[int, Any]]], case: str
) -> None:
    (one, routed) = next((want, got) for name, want, got in answers if name == case)
    assert routed == one


def test_the_corpus_exercises_both_groups_and_both_outcomes(
    answers: list[tuple[str, tuple[int, Any], tuple[int, Any]]],
) -> None:
    """The corpus is not vacuous: lenet2 answers 200 in many shapes that must reach the second group."""
    statuses = [one[0] for _, one, _ in answers]
    assert statuses.count(200) >= 12
    assert {400, 404, 422} <= set(statuses)
