"""Every endpoint once: how its request is built and how its answer is read, for both clients.

A `Call` is protocol data only (method, path, query, a body factory, a parser); `Client` and
`AsyncClient` send it with their own I/O, so the two never disagree about an endpoint.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from PIL import Image

from service.client.inputs import Body, ImageInput, Inputs, build_body, json_inputs
from service.client.metadata import CheckpointInfo, Health, Layer, ModelInfo, Nodes, OptimizerInfo, StateDict, Summary
from service.client.results import (
    Activations,
    ActivationStats,
    AttentionMaps,
    CostEstimate,
    Gradients,
    Intervention,
    Predictions,
    Saliency,
    Sweep,
)
from service.client.tensors import Array, binary_answer, from_json_tensor, read_safetensors

T = TypeVar("T")
Target = int | str | Sequence[int | str] | None


class Wire(StrEnum):
    """How tensors travel. `safetensors`/`npz`: images as multipart files, tensors as base64 bytes,
    answers as binary files. `json`: everything JSON (images base64, tensors as lists)."""

    safetensors = "safetensors"
    npz = "npz"
    json = "json"


class ClientDefault:
    """The type of `DEFAULT`: "use the client's timeout"."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = ClientDefault()
TimeoutArg = float | None | ClientDefault


@dataclass(frozen=True)
class Call(Generic[T]):
    """One HTTP exchange: `parse` reads an answer whose status is 2xx or in `ok`; 503s are retried unless in `ok`."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    body: Callable[[], Body] | None = None
    admin: bool = False
    ok: tuple[int, ...] = ()


def _name(model: str) -> str:
    return quote(model, safe="")


def _json(response: httpx.Response) -> Any:
    return response.json()


def _is_binary(response: httpx.Response) -> bool:
    return str(response.headers.get("content-type", "")).startswith("application/octet-stream")


def _image(response: httpx.Response) -> Image.Image:
    image = Image.open(io.BytesIO(response.content))
    image.load()
    return image


def _targets(target: Target) -> Any:
    if target is None or isinstance(target, (int, str)):
        return target
    return list(target)


# ---- health and the registry --------------------------------------------------------------


def health() -> Call[Health]:
    def parse(r: httpx.Response) -> Health:
        body = r.json()
        return Health(True, r.status_code == 200, str(body.get("status", "")), dict(body.get("models") or {}))

    return Call("GET", "/readyz", parse, ok=(503,))  # 503 here means "not ready yet", an answer


def models() -> Call[list[ModelInfo]]:
    return Call("GET", "/models", lambda r: [ModelInfo.from_json(m) for m in r.json()["models"]])


def model(name: str) -> Call[ModelInfo]:
    return Call("GET", f"/models/{_name(name)}", lambda r: ModelInfo.from_json(r.json()))


def load_model(spec: Mapping[str, Any]) -> Call[ModelInfo]:
    return Call(
        "POST", "/models", lambda r: ModelInfo.from_json(r.json()), body=lambda: Body(json=dict(spec)), admin=True
    )


def unload_model(name: str) -> Call[ModelInfo]:
    return Call("DELETE", f"/models/{_name(name)}", lambda r: ModelInfo.from_json(r.json()), admin=True)


# ---- model-running calls ------------------------------------------------------------------


def predict(model: str, inputs: Inputs, wire: Wire, *, top_k: int, include_logits: bool) -> Call[Predictions]:
    fields = {"top_k": top_k, "include_logits": include_logits}
    return Call(
        "POST",
        "/predict",
        lambda r: Predictions.from_json(r.json()),
        body=lambda: build_body(model, inputs, fields, binary=wire is not Wire.json),
    )


Tokens = Sequence[int] | str | None  # a vision transformer's tokens: indices, "patches" or "prefix"


def _tokens(tokens: Tokens) -> Any:
    return tokens if tokens is None or isinstance(tokens, str) else list(tokens)


def activations(
    model: str,
    inputs: Inputs,
    wire: Wire,
    *,
    layers: Sequence[str],
    capture: str,
    reduce: str | None,
    tokens: Tokens = None,
) -> Call[Activations[Array]]:
    fields = {
        "layers": list(layers),
        "capture": capture,
        "reduce": reduce,
        "tokens": _tokens(tokens),
        "format": wire.value,
    }

    def parse(r: httpx.Response) -> Activations[Array]:
        if _is_binary(r):
            tensors, rest = binary_answer(r.content, wire.value)
            return Activations.from_binary(tensors, rest)
        data = r.json()
        nested = {
            layer: {side: from_json_tensor(t) for side, t in sides.items()}
            for layer, sides in data["activations"].items()
        }
        return Activations(str(data["model"]), nested, Predictions.from_json(data).predictions)

    return Call("POST", "/activations", parse, body=lambda: build_body(model, inputs, fields, binary=_binary(wire)))


def activation_stats(
    model: str,
    inputs: Inputs,
    wire: Wire,
    *,
    layers: Sequence[str],
    capture: str,
    reduce: str | None,
    tokens: Tokens = None,
) -> Call[ActivationStats]:
    fields = {
        "layers": list(layers),
        "capture": capture,
        "reduce": reduce,
        "tokens": _tokens(tokens),
        "format": "stats",
    }
    return Call(
        "POST",
        "/activations",
        lambda r: ActivationStats.from_json(r.json()),
        body=lambda: build_body(model, inputs, fields, binary=_binary(wire)),
    )


def activations_image(model: str, image: ImageInput, wire: Wire, *, layer: str, channels: int) -> Call[Image.Image]:
    fields = {"layers": [layer], "format": "png", "channels": channels}
    return Call("POST", "/activations", _image, body=lambda: build_body(model, image, fields, binary=_binary(wire)))


def gradients(
    model: str, inputs: Inputs, wire: Wire, *, target: Target, layers: Sequence[str], include_input: bool
) -> Call[Gradients[Array]]:
    fields = {"target": _targets(target), "layers": list(layers), "include_input": include_input, "format": wire.value}

    def parse(r: httpx.Response) -> Gradients[Array]:
        if _is_binary(r):
            tensors, rest = binary_answer(r.content, wire.value)
            order = list(rest.get("gradients") or tensors)
            grads = {k: tensors[k] for k in order if k in tensors}
        else:
            rest = r.json()
            grads = {k: from_json_tensor(v) for k, v in rest["gradients"].items()}
        targets = [int(t) for t in rest["targets"]]
        return Gradients(str(rest["model"]), targets, [float(s) for s in rest["scores"]], grads)

    return Call("POST", "/gradients", parse, body=lambda: build_body(model, inputs, fields, binary=_binary(wire)))


def method_params(
    *,
    layer: str | None = None,
    steps: int | None = None,
    samples: int | None = None,
    noise: float | None = None,
    seed: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A saliency method's own parameters, only those given: each method takes its own (gradcam `layer`,
    integrated_gradients `steps`, smoothgrad `samples`, `noise`, `seed`; `extra` for any other), and the
    server refuses a parameter of another method. What is left out takes the server's default."""
    given = {"layer": layer, "steps": steps, "samples": samples, "noise": noise, "seed": seed, **(extra or {})}
    return {key: value for key, value in given.items() if value is not None}


def saliency(
    model: str, inputs: Inputs, wire: Wire, *, method: str, target: Target, params: Mapping[str, Any]
) -> Call[Saliency[Array]]:
    fields = {"method": method, "target": _targets(target), **params, "format": wire.value}

    def parse(r: httpx.Response) -> Saliency[Array]:
        if _is_binary(r):
            tensors, rest = binary_answer(r.content, wire.value)
            return Saliency.build(rest, lambda i, _: (tensors[f"{i}:attribution"], tensors[f"{i}:heatmap"]))
        data = r.json()
        return Saliency.build(
            data, lambda _, item: (from_json_tensor(item["attribution"]), from_json_tensor(item["heatmap"]))
        )

    return Call("POST", "/saliency", parse, body=lambda: build_body(model, inputs, fields, binary=_binary(wire)))


def saliency_image(
    model: str, inputs: Inputs, wire: Wire, *, method: str, target: Target, params: Mapping[str, Any], alpha: float
) -> Call[Image.Image]:
    fields = {"method": method, "target": _targets(target), **params, "format": "png", "alpha": alpha}
    return Call("POST", "/saliency", _image, body=lambda: build_body(model, inputs, fields, binary=_binary(wire)))


def interventions(
    model: str,
    inputs: Inputs,
    wire: Wire,
    *,
    edits: Sequence[Mapping[str, Any]],
    sources: Mapping[str, Inputs] | None,
    target: Target,
    layers: Sequence[str],
) -> Call[Intervention[Array]]:
    """Edits are the API's own dicts (`{"site": ..., "op": "zero", "channels": [...]}`); `sources` (donor runs
    for `patch`) go as JSON with base64 inputs, so a request with sources is sent as JSON whatever `wire` says."""
    fields: dict[str, Any] = {"edits": list(edits), "target": _targets(target), "include_logits": True}
    if layers:
        fields |= {"layers": list(layers), "format": wire.value}

    def body() -> Body:
        if sources:
            donors = {name: json_inputs(items) for name, items in sources.items()}
            return build_body(model, inputs, fields | {"sources": donors}, binary=False)
        return build_body(model, inputs, fields, binary=_binary(wire))

    def parse(r: httpx.Response) -> Intervention[Array]:
        if _is_binary(r):
            tensors, rest = binary_answer(r.content, wire.value)
            return Intervention.build(rest, Activations.from_binary(tensors, rest))
        data = r.json()
        nested = {
            layer: {side: from_json_tensor(t) for side, t in sides.items()}
            for layer, sides in (data.get("activations") or {}).items()
        }
        return Intervention.build(data, Activations(str(data["model"]), nested))

    return Call("POST", "/interventions", parse, body=body)


def sweep(
    model: str,
    inputs: Inputs,
    wire: Wire,
    *,
    site: str,
    call: int,
    op: str,
    channels: tuple[int, int] | None,
    target: Target,
    over: str = "channels",
    heads: tuple[int, int] | None = None,
) -> Call[Sweep]:
    fields: dict[str, Any] = {"site": site, "call": call, "op": op, "target": _targets(target), "over": over}
    if channels is not None:
        fields["channels"] = list(channels)
    if heads is not None:
        fields["heads"] = list(heads)
    return Call(
        "POST",
        "/interventions/sweep",
        lambda r: Sweep.from_json(r.json()),
        body=lambda: build_body(model, inputs, fields, binary=_binary(wire)),
    )


def attention(
    model: str,
    inputs: Inputs,
    wire: Wire,
    *,
    blocks: Sequence[str],
    heads: Sequence[int] | None,
    queries: Tokens,
) -> Call[AttentionMaps[Array]]:
    """`queries`: token indices, "all", "patches" or "prefix"; None is the class token's row."""
    fields = {
        "blocks": list(blocks) or None,
        "heads": list(heads) if heads is not None else None,
        "queries": _tokens(queries),
        "format": wire.value,
    }

    def parse(r: httpx.Response) -> AttentionMaps[Array]:
        if _is_binary(r):
            tensors, rest = binary_answer(r.content, wire.value)
            return AttentionMaps.build(rest, tensors)
        data = r.json()
        return AttentionMaps.build(data, {key: from_json_tensor(t) for key, t in data["attention"].items()})

    return Call("POST", "/attention", parse, body=lambda: build_body(model, inputs, fields, binary=_binary(wire)))


def attention_image(
    model: str, image: ImageInput, wire: Wire, *, blocks: Sequence[str], heads: Sequence[int] | None, alpha: float
) -> Call[Image.Image]:
    fields = {
        "blocks": list(blocks) or None,
        "heads": list(heads) if heads is not None else None,
        "format": "png",
        "alpha": alpha,
    }
    return Call("POST", "/attention", _image, body=lambda: build_body(model, image, fields, binary=_binary(wire)))


def estimate(model: str, inputs: Inputs, wire: Wire, *, path: str, fields: Mapping[str, Any]) -> Call[CostEstimate]:
    """`path`'s request with `fields`, sent as a dry run: its cost, nothing run."""
    body = {**fields, "dry_run": True}
    return Call(
        "POST",
        path,
        lambda r: CostEstimate.from_json(r.json()),
        body=lambda: build_body(model, inputs, body, binary=_binary(wire)),
    )


def _binary(wire: Wire) -> bool:
    return wire is not Wire.json


# ---- read-only introspection ---------------------------------------------------------------


def layers(model: str) -> Call[list[Layer]]:
    return Call("GET", f"/models/{_name(model)}/layers", lambda r: [Layer.from_json(x) for x in r.json()["layers"]])


def nodes(model: str) -> Call[Nodes]:
    return Call("GET", f"/models/{_name(model)}/nodes", lambda r: Nodes.from_json(r.json()))


def summary(model: str, *, input_size: Sequence[int] | None, depth: int) -> Call[Summary]:
    params: dict[str, Any] = {"depth": depth}
    if input_size is not None:
        params["input_size"] = ",".join(str(int(s)) for s in input_size)
    return Call("GET", f"/models/{_name(model)}/summary", lambda r: Summary.from_json(r.json()), params=params)


def state_dict(model: str, *, stats: bool) -> Call[StateDict]:
    return Call(
        "GET",
        f"/models/{_name(model)}/state-dict",
        lambda r: StateDict.from_json(r.json()),
        params={"stats": "true" if stats else "false"},
    )


def state_dict_tensor(model: str, key: str) -> Call[Array]:
    def parse(r: httpx.Response) -> Array:
        tensors, _ = read_safetensors(r.content)
        return tensors[key]

    return Call("GET", f"/models/{_name(model)}/state-dict", parse, params={"key": key, "format": "safetensors"})


def optimizer(model: str) -> Call[OptimizerInfo]:
    return Call("GET", f"/models/{_name(model)}/optimizer", lambda r: OptimizerInfo.from_json(r.json()))


def inspect_checkpoint(
    file: str | Path | bytes | None, *, path: str | None, compare_to: str | None, stats: bool
) -> Call[CheckpointInfo]:
    """`file`: a local checkpoint (uploaded); `path`: one under the server's model dir (sent as JSON)."""
    if (file is None) == (path is None):
        raise ValueError("give exactly one of file (a local checkpoint to upload) or path (under the model dir)")
    params: dict[str, Any] = {"stats": "true" if stats else "false"}
    if compare_to is not None:
        params["compare_to"] = compare_to

    upload = file

    def body() -> Body:
        if upload is None:
            return Body(json={"path": path})
        if isinstance(upload, bytes):
            name, content = "checkpoint", upload
        else:
            name, content = Path(upload).name, Path(upload).read_bytes()
        return Body(data={}, files=[("file", (name, content, "application/octet-stream"))])

    return Call("POST", "/checkpoints/inspect", lambda r: CheckpointInfo.from_json(r.json()), params=params, body=body)


def job_body(
    kind: str,
    model: str,
    dataset: str,
    layers: Sequence[str],
    *,
    limit: int | None,
    parameters: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """POST /jobs's body."""
    body: dict[str, Any] = {"kind": kind, "model": model, "dataset": dataset, "layers": list(layers)}
    if limit is not None:
        body["limit"] = limit
    if parameters:
        body["parameters"] = dict(parameters)
    return body


def start_job(body: Mapping[str, Any]) -> Call[dict[str, Any]]:
    return Call("POST", "/jobs", _json, body=lambda: Body(json=dict(body)), admin=True)


def jobs() -> Call[list[dict[str, Any]]]:
    return Call("GET", "/jobs", lambda r: list(r.json()["jobs"]), admin=True)


def job(job_id: str) -> Call[dict[str, Any]]:
    return Call("GET", f"/jobs/{_name(job_id)}", _json, admin=True)


def cancel_job(job_id: str) -> Call[dict[str, Any]]:
    return Call("DELETE", f"/jobs/{_name(job_id)}", _json, admin=True)


def job_result(job_id: str) -> Call[dict[str, Any]]:
    return Call("GET", f"/jobs/{_name(job_id)}/result", _json, admin=True)


def job_file(job_id: str, name: str) -> Call[bytes]:
    return Call("GET", f"/jobs/{_name(job_id)}/files/{_name(name)}", _content, admin=True)


def _content(response: httpx.Response) -> bytes:
    return response.content


def check_job_file(name: str, data: bytes, result: Mapping[str, Any]) -> bytes:
    """`data` as the job's result records it (size and SHA-256 of each shard); `ValueError` if it is not."""
    for shard in result.get("shards", []):
        recorded = (shard.get("bytes"), shard.get("sha256"))
        if shard.get("file") == name and (len(data), hashlib.sha256(data).hexdigest()) != recorded:
            raise ValueError(f"{name}: {len(data)} bytes that do not match the job's record of them")
    return data


def raw(method: str, path: str, **params: Any) -> Call[Any]:
    """Any other endpoint, answered as parsed JSON (e.g. `/v2` metadata)."""
    return Call(method, path, _json, params=params or None)
