"""`Client`: the blocking client, one method per endpoint (over an `httpx.Client`).

>>> from service.client import Client
>>> with Client("http://127.0.0.1:8000") as client:  # doctest: +SKIP
...     client.predict("lenet", "service/zoo/samples/digit_7.png").labels()
['7']
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
from PIL import Image

from service.client import calls
from service.client.base import DEFAULT_TIMEOUT, DEFAULT_URL, ClientBase
from service.client.calls import DEFAULT, Call, Target, TimeoutArg, Wire
from service.client.errors import Conflict
from service.client.inputs import ImageInput, Inputs
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
from service.client.retry import Retry
from service.client.tensors import Array

T = TypeVar("T")


class Client(ClientBase):
    """A hookserve server at `url`. Use as a context manager (or call `close()`).

    `wire` picks how tensors travel (`"safetensors"` by default: binary both ways; `"json"`
    for plain JSON); `timeout` is the default per call (each method takes `timeout=` too);
    503 answers are retried per `retry`. `http` lends an `httpx.Client` of your own
    (its base URL must be `url`; the caller closes it).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        retry: Retry | None = None,
        wire: Wire | str = Wire.safetensors,
        http: httpx.Client | None = None,
    ) -> None:
        super().__init__(url, token=token, timeout=timeout, retry=retry, wire=wire)
        self._owns_http = http is None
        self.http = http if http is not None else httpx.Client(base_url=self.url, timeout=timeout, trust_env=False)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_http:
            self.http.close()

    def send(self, call: Call[T], timeout: TimeoutArg = DEFAULT) -> T:
        """Send one call, retrying 503s per the retry policy; the parsed answer or a `HookserveError`."""
        body = call.body().httpx_kwargs() if call.body is not None else {}
        kwargs = self._request_kwargs(call, body, timeout)
        attempt = 0
        while True:
            try:
                response = self.http.request(**kwargs)
            except httpx.TransportError as exc:
                raise self._transport_error(call, exc) from exc
            attempt += 1
            delay = self._retry_delay(call, response, attempt)
            if delay is None:
                return self._answer(call, response)
            time.sleep(delay)

    # ---- health and the registry ----

    def health(self, *, timeout: TimeoutArg = DEFAULT) -> Health:
        """Live (any answer) and ready (every model ready); `not_ready` says which are not and why."""
        return self.send(calls.health(), timeout)

    def models(self, *, timeout: TimeoutArg = DEFAULT) -> list[ModelInfo]:
        return self.send(calls.models(), timeout)

    def model(self, name: str, *, timeout: TimeoutArg = DEFAULT) -> ModelInfo:
        """One model's INFO, with `repr` (the text of `print(model)`)."""
        return self.send(calls.model(name), timeout)

    def load_model(self, spec: Mapping[str, Any], *, timeout: TimeoutArg = DEFAULT) -> ModelInfo:
        """Load a model at run time (admin token): `spec` is one `[[models]]` entry; answers while it loads."""
        return self.send(calls.load_model(spec), timeout)

    def unload_model(self, name: str, *, timeout: TimeoutArg = DEFAULT) -> ModelInfo:
        """Unload a model (admin token) once its memory is released; its last INFO."""
        return self.send(calls.unload_model(name), timeout)

    def start_job(
        self,
        kind: str,
        model: str,
        dataset: str,
        layers: Sequence[str],
        *,
        limit: int | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout: TimeoutArg = DEFAULT,
    ) -> dict[str, Any]:
        """Start a data-set job (admin token) over `dataset` (`digits`, or a folder under the server's
        data dir): `unit_stats`, `exemplars`, `similarity`, `steering_vector` or `features` of `layers`; the
        queued job, with its `id`."""
        body = calls.job_body(kind, model, dataset, layers, limit=limit, parameters=parameters)
        return self.send(calls.start_job(body), timeout)

    def jobs(self, *, timeout: TimeoutArg = DEFAULT) -> list[dict[str, Any]]:
        """Every data-set job on the server (admin token), oldest first."""
        return self.send(calls.jobs(), timeout)

    def job(self, job_id: str, *, timeout: TimeoutArg = DEFAULT) -> dict[str, Any]:
        """A job's state, progress, rate, ETA and per-file errors (admin token)."""
        return self.send(calls.job(job_id), timeout)

    def cancel_job(self, job_id: str, *, timeout: TimeoutArg = DEFAULT) -> dict[str, Any]:
        """Cancel a queued or running job, or delete a finished one with its files (admin token)."""
        return self.send(calls.cancel_job(job_id), timeout)

    def job_result(self, job_id: str, *, timeout: TimeoutArg = DEFAULT) -> dict[str, Any]:
        """A succeeded job's result (admin token); `Conflict` while it runs or when it failed."""
        return self.send(calls.job_result(job_id), timeout)

    def download_job(self, job_id: str, out_dir: str | Path, *, timeout: TimeoutArg = DEFAULT) -> Path:
        """Every file a succeeded job's result lists (a features job's `index.json` and shards, each checked
        against its SHA-256) into `out_dir`; `read_features(out_dir)` then reads them."""
        from service.client.features.store import write_atomic  # the features package imports this client

        result = self.job_result(job_id, timeout=timeout)
        folder = Path(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for name in result.get("files", []):
            data = self.send(calls.job_file(job_id, name), timeout)
            write_atomic(folder / name, calls.check_job_file(name, data, result))
        return folder

    def wait_for_job(self, job_id: str, *, timeout: float = 3600.0, poll: float = 0.5) -> dict[str, Any]:
        """Poll until the job ends (succeeded, failed or cancelled) and return its last state;
        `TimeoutError` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info["state"] not in ("queued", "running"):
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {info['state']} after {timeout:g} s")
            time.sleep(poll)

    def wait_for_model(self, name: str, *, timeout: float = 300.0, poll: float = 0.1) -> ModelInfo:
        """Poll until `name` is ready; `Conflict` when it failed, `TimeoutError` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.model(name)
            if info.status == "ready":
                return info
            if info.status == "failed":
                raise Conflict(f"model {name!r} failed to load: {info.error}", status=409)
            if time.monotonic() > deadline:
                raise TimeoutError(f"model {name!r} still {info.status} after {timeout} s")
            time.sleep(poll)

    # ---- model-running calls ----

    def predict(
        self,
        model: str,
        inputs: Inputs,
        *,
        top_k: int = 5,
        include_logits: bool = False,
        timeout: TimeoutArg = DEFAULT,
    ) -> Predictions:
        """Top-k classes (softmax probabilities) per input; with `include_logits`, every logit too."""
        return self.send(calls.predict(model, inputs, self.wire, top_k=top_k, include_logits=include_logits), timeout)

    def activations(
        self,
        model: str,
        inputs: Inputs,
        layers: Sequence[str],
        *,
        capture: str = "output",
        reduce: str | None = None,
        tokens: calls.Tokens = None,
        timeout: TimeoutArg = DEFAULT,
    ) -> Activations[Array]:
        """What named layers (module paths or fnmatch patterns) received and returned; `reduce`: mean|max|flatten
        (over the tokens of a vision transformer's `[N, T, D]`); `tokens` keeps some of those: indices, "patches"
        or "prefix"."""
        call = calls.activations(model, inputs, self.wire, layers=layers, capture=capture, reduce=reduce, tokens=tokens)
        return self.send(call, timeout)

    def activation_stats(
        self,
        model: str,
        inputs: Inputs,
        layers: Sequence[str],
        *,
        capture: str = "output",
        reduce: str | None = None,
        tokens: calls.Tokens = None,
        timeout: TimeoutArg = DEFAULT,
    ) -> ActivationStats:
        """Shape, min, max, mean, std and zero fraction of each captured tensor, instead of the tensor."""
        call = calls.activation_stats(
            model, inputs, self.wire, layers=layers, capture=capture, reduce=reduce, tokens=tokens
        )
        return self.send(call, timeout)

    def activations_image(
        self, model: str, image: ImageInput, layer: str, *, channels: int = 64, timeout: TimeoutArg = DEFAULT
    ) -> Image.Image:
        """The channels of one layer's output for one image, as a grid of grayscale tiles."""
        return self.send(calls.activations_image(model, image, self.wire, layer=layer, channels=channels), timeout)

    def gradients(
        self,
        model: str,
        inputs: Inputs,
        *,
        target: Target = None,
        layers: Sequence[str] = (),
        include_input: bool = True,
        timeout: TimeoutArg = DEFAULT,
    ) -> Gradients[Array]:
        """d(target logit)/d(layer outputs) and d/d(input); `target` None is each input's top-1."""
        call = calls.gradients(model, inputs, self.wire, target=target, layers=layers, include_input=include_input)
        return self.send(call, timeout)

    def interventions(
        self,
        model: str,
        inputs: Inputs,
        edits: Sequence[Mapping[str, Any]],
        *,
        sources: Mapping[str, Inputs] | None = None,
        target: Target = None,
        layers: Sequence[str] = (),
        timeout: TimeoutArg = DEFAULT,
    ) -> Intervention[Array]:
        """Apply `edits` (e.g. `{"site": "conv2", "op": "zero", "channels": [15]}`; ops zero, scale, add, clamp,
        mean, noise, patch, set) in one forward: the top-k before and after, the target's change, captures of
        `layers` after the edits. `sources` names donor runs for `patch` edits."""
        call = calls.interventions(model, inputs, self.wire, edits=edits, sources=sources, target=target, layers=layers)
        return self.send(call, timeout)

    def sweep(
        self,
        model: str,
        inputs: Inputs,
        site: str,
        *,
        call: int = 1,
        op: str = "zero",
        channels: tuple[int, int] | None = None,
        target: Target = None,
        over: str = "channels",
        heads: tuple[int, int] | None = None,
        timeout: TimeoutArg = DEFAULT,
    ) -> Sweep:
        """Ablate each channel of `site` (`op` zero or mean; `channels` a [start, stop) range) in turn and rank
        the channels by the change of the target score, most needed first. `over="heads"`: the heads of the
        attention module `site` (`heads` a [start, stop) range) instead."""
        request = calls.sweep(
            model,
            inputs,
            self.wire,
            site=site,
            call=call,
            op=op,
            channels=channels,
            target=target,
            over=over,
            heads=heads,
        )
        return self.send(request, timeout)

    def estimate(
        self,
        path: str,
        model: str,
        inputs: Inputs,
        *,
        timeout: TimeoutArg = DEFAULT,
        **fields: Any,
    ) -> CostEstimate:
        """What the request to `path` (`/predict`, `/saliency`, `/activations`...) with these fields would cost,
        as a dry run: memory by part, forwards, seconds, rows per forward, whether it would be admitted now.
        Nothing runs; e.g. `estimate("/saliency", "resnet18", image, method="occlusion")`."""
        return self.send(calls.estimate(model, inputs, self.wire, path=path, fields=fields), timeout)

    def saliency(
        self,
        model: str,
        inputs: Inputs,
        *,
        method: str = "gradient",
        target: Target = None,
        layer: str | None = None,
        steps: int | None = None,
        samples: int | None = None,
        noise: float | None = None,
        seed: int | None = None,
        params: Mapping[str, Any] | None = None,
        timeout: TimeoutArg = DEFAULT,
    ) -> Saliency[Array]:
        """Captum attributions: gradient, input_x_gradient, smoothgrad, integrated_gradients, gradcam.

        Give only the parameters of `method` (gradcam: `layer`; integrated_gradients: `steps`; smoothgrad:
        `samples`, `noise`, `seed`; any other method's in `params`); the rest take the server's defaults.
        """
        call = calls.saliency(
            model,
            inputs,
            self.wire,
            method=method,
            target=target,
            params=calls.method_params(layer=layer, steps=steps, samples=samples, noise=noise, seed=seed, extra=params),
        )
        return self.send(call, timeout)

    def saliency_image(
        self,
        model: str,
        inputs: Inputs,
        *,
        method: str = "gradient",
        target: Target = None,
        layer: str | None = None,
        steps: int | None = None,
        samples: int | None = None,
        noise: float | None = None,
        seed: int | None = None,
        params: Mapping[str, Any] | None = None,
        alpha: float = 0.5,
        timeout: TimeoutArg = DEFAULT,
    ) -> Image.Image:
        """The heatmap blended over the input (a grid for several inputs), as a PIL image."""
        call = calls.saliency_image(
            model,
            inputs,
            self.wire,
            method=method,
            target=target,
            params=calls.method_params(layer=layer, steps=steps, samples=samples, noise=noise, seed=seed, extra=params),
            alpha=alpha,
        )
        return self.send(call, timeout)

    def attention(
        self,
        model: str,
        inputs: Inputs,
        *,
        blocks: Sequence[str] = (),
        heads: Sequence[int] | None = None,
        queries: calls.Tokens = None,
        timeout: TimeoutArg = DEFAULT,
    ) -> AttentionMaps[Array]:
        """A vision transformer's attention probabilities `[N, heads, queries, T]` per attention module: `blocks`
        (module paths or patterns; default every one), `heads` (default all), `queries` (token indices, "all",
        "patches" or "prefix"; default the class token's row)."""
        call = calls.attention(model, inputs, self.wire, blocks=blocks, heads=heads, queries=queries)
        return self.send(call, timeout)

    def attention_image(
        self,
        model: str,
        image: ImageInput,
        *,
        blocks: Sequence[str] = (),
        heads: Sequence[int] | None = None,
        alpha: float = 0.5,
        timeout: TimeoutArg = DEFAULT,
    ) -> Image.Image:
        """The class token's attention over the image: a row per block, a column per head, as a PIL image."""
        call = calls.attention_image(model, image, self.wire, blocks=blocks, heads=heads, alpha=alpha)
        return self.send(call, timeout)

    # ---- read-only introspection ----

    def layers(self, model: str, *, timeout: TimeoutArg = DEFAULT) -> list[Layer]:
        return self.send(calls.layers(model), timeout)

    def nodes(self, model: str, *, timeout: TimeoutArg = DEFAULT) -> Nodes:
        """The FX graph nodes /activations can capture beside module paths (e.g. `layer1.0.add`), in execution
        order, with each one's op, module and output shape (422 for a model FX cannot trace)."""
        return self.send(calls.nodes(model), timeout)

    def summary(
        self, model: str, *, input_size: Sequence[int] | None = None, depth: int = 3, timeout: TimeoutArg = DEFAULT
    ) -> Summary:
        """torchinfo's summary; `input_size` includes the batch dim (default 1 + the model's)."""
        return self.send(calls.summary(model, input_size=input_size, depth=depth), timeout)

    def state_dict(self, model: str, *, stats: bool = False, timeout: TimeoutArg = DEFAULT) -> StateDict:
        return self.send(calls.state_dict(model, stats=stats), timeout)

    def state_dict_tensor(self, model: str, key: str, *, timeout: TimeoutArg = DEFAULT) -> Array:
        """One state-dict tensor's values."""
        return self.send(calls.state_dict_tensor(model, key), timeout)

    def optimizer(self, model: str, *, timeout: TimeoutArg = DEFAULT) -> OptimizerInfo:
        return self.send(calls.optimizer(model), timeout)

    def inspect_checkpoint(
        self,
        file: str | Path | bytes | None = None,
        *,
        path: str | None = None,
        compare_to: str | None = None,
        stats: bool = False,
        timeout: TimeoutArg = DEFAULT,
    ) -> CheckpointInfo:
        """A local checkpoint `file` (uploaded) or a `path` under the server's model dir; no pickle runs."""
        return self.send(calls.inspect_checkpoint(file, path=path, compare_to=compare_to, stats=stats), timeout)
