"""Shared fixtures: apps over the built-in registry or a config written into a temp model dir."""

from __future__ import annotations

import base64
import copy
import io
import json
import os
import shutil
import struct
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image
from safetensors.torch import load as safetensors_load

from service.codecs.preprocess import preprocess_image
from service.config import Settings
from service.main import create_app
from service.registry.loader import use_channels_last
from service.specs.model import MemoryFormat
from service.zoo.lenet import LENET_MEAN, LENET_STD, labels_path, lenet_preprocess_spec, samples_dir, weights_path

torch.set_num_threads(1)

# The fronts beside HTTP listen on fixed ports by default (gRPC 8001, TorchServe management 8081): tests never
# bind a fixed port, so apps and servers the tests start serve none unless a test asks for one on port 0.
os.environ["HOOKSERVE_GRPC_PORT"] = "off"
os.environ["HOOKSERVE_TORCHSERVE_MANAGEMENT_PORT"] = "off"
# Forward-only captures move to ONNX Runtime after a few sightings (values within 1e-4 of the hooks'): tests that
# compare captures with hooks of their own at 1e-6 see hooks only, unless they ask for capture plans.
os.environ["HOOKSERVE_CAPTURE_PLANS"] = "0"

ClientFactory = Callable[..., TestClient]


def wait_settled(client: TestClient | httpx.Client, timeout: float = 120.0) -> None:
    """Block until no model is `loading` (ready or failed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        models = client.get("/models").json()["models"]
        if all(m["status"] != "loading" for m in models):
            return
        time.sleep(0.05)
    raise TimeoutError("models still loading")


@pytest.fixture(scope="session")
def builtin_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The built-in registry (lenet, resnet18, efficientvit_b0), shared by the whole session."""
    settings = Settings(model_dir=tmp_path_factory.mktemp("models"), worker_threads=2, torch_threads=1)
    with TestClient(create_app(settings)) as client:
        wait_settled(client)
        yield client


@pytest.fixture
def make_client(tmp_path: Path) -> Iterator[ClientFactory]:
    """`make_client(toml_text, **settings)`: an app over a models TOML in `tmp_path` (the model dir)."""
    stack: list[TestClient] = []

    def factory(config: str | None = None, *, wait: bool = True, **overrides: Any) -> TestClient:
        config_path = None
        if config is not None:
            config_path = tmp_path / "models.toml"
            config_path.write_text(config)
        settings = Settings(model_dir=tmp_path, config=config_path, **overrides)
        client = TestClient(create_app(settings))
        client.__enter__()
        stack.append(client)
        if wait:
            wait_settled(client)
        return client

    yield factory
    for client in reversed(stack):
        client.__exit__(None, None, None)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def sample_png(label: int) -> bytes:
    """A held-out digits sample shipped with the package, as PNG bytes."""
    return (samples_dir() / f"digit_{label}.png").read_bytes()


def tensor_input(t: torch.Tensor, *, as_b64: bool = False) -> dict[str, Any]:
    """One JSON tensor input for the API."""
    if as_b64:
        return {"tensor": {"shape": list(t.shape), "dtype": "float32", "b64": b64(t.float().numpy().tobytes())}}
    return {"tensor": {"shape": list(t.shape), "dtype": "float32", "data": t.float().tolist()}}


def write_lenet(model_dir: Path, name: str = "lenet", labels: str = "digits_labels.txt") -> str:
    """Copy the shipped LeNet weights and a labels file into `model_dir`; return the TOML entry serving them.

    The preprocessing is spelled out (as a user's config would) rather than taken from the zoo.
    """
    shutil.copyfile(weights_path(), model_dir / "lenet_digits.pt")
    if not (model_dir / labels).exists():
        shutil.copyfile(labels_path(), model_dir / labels)
    return f"""
[[models]]
name = "{name}"
source = "python"
architecture = "service.zoo.lenet:LeNet"
weights = "lenet_digits.pt"
labels = "{labels}"
input_size = [3, 32, 32]
max_batch_delay_ms = 1.0
{DIGITS_PREPROCESS}"""


DIGITS_PREPROCESS = f"""[models.preprocess]
resize = 32
crop = 32
interpolation = "bilinear"
mean = {LENET_MEAN}
std = {LENET_STD}
grayscale = true
"""
"""The zoo's digits preprocessing as a user's config spells it (the LeNet and the ViT share it)."""


HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_pre_hooks_with_kwargs",
)


def assert_no_module_hooks(model: torch.nn.Module) -> None:
    """Every hook dict of every submodule is empty (what `INFO.hooks == 0` promises)."""
    for name, module in model.named_modules():
        for attr in HOOK_DICTS:
            assert not getattr(module, attr), f"{name!r}.{attr} still holds hooks"


def assert_served_copies_clean(app: Any, name: str) -> None:
    """No hook left and nothing in training mode on the served module nor on any hook lane of model `name`."""
    for served in app.state.hookserve.fleet.ready(name).model.hookable_modules:
        assert_no_module_hooks(served)
        assert not any(module.training for module in served.modules())


def as_tensor(payload: dict[str, Any]) -> torch.Tensor:
    """A JSON tensor of an answer back into a float32 tensor, checking its declared shape and dtype."""
    assert payload["dtype"] == "float32"
    t = torch.tensor(payload["data"], dtype=torch.float32)
    assert list(t.shape) == payload["shape"]
    return t


def hooks(client: TestClient, name: str) -> int:
    """The hook count `GET /models/{name}` reports."""
    count: int = client.get(f"/models/{name}").json()["hooks"]
    return count


def digit_pixels(label: int) -> torch.Tensor:
    """What the server feeds lenet for a shipped digit sample: the same preprocessing, in-process."""
    return preprocess_image(Image.open(io.BytesIO(sample_png(label))), lenet_preprocess_spec(), 3)


def read_binary_answer(content: bytes, fmt: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A safetensors or npz answer: its tensors, and the rest of the JSON answer its metadata carries."""
    if fmt == "safetensors":
        (length,) = struct.unpack("<Q", content[:8])
        metadata = json.loads(content[8 : 8 + length])["__metadata__"]
        return safetensors_load(content), json.loads(metadata["response"])
    with np.load(io.BytesIO(content), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    response = arrays.pop("__response__")
    assert response.shape == ()  # a 0-d unicode array, as API.md says
    assert response.dtype.kind == "U"
    return {k: torch.from_numpy(v) for k, v in arrays.items()}, json.loads(str(response))


def _store_capture(out: dict[str, dict[str, torch.Tensor]], key: str, side: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        out.setdefault(key, {})[side] = value.detach().clone()
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            _store_capture(out, f"{key}.{i}", side, v)


def direct_capture(
    model: torch.nn.Module, names: Sequence[str], x: torch.Tensor, capture: str = "output"
) -> dict[str, dict[str, torch.Tensor]]:
    """Captures with hooks registered here: per-call numbering `name`, `name#2`; clones at hook time.

    The reference runs in the memory format the server picks for it (channels_last for
    convolutional image models), so that the same kernels run and 1e-6 still holds.
    """
    if use_channels_last(MemoryFormat.auto, model, list(x.shape[1:])):
        model = copy.deepcopy(model).to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    out: dict[str, dict[str, torch.Tensor]] = {}
    calls: Counter[str] = Counter()
    open_keys: dict[str, list[str]] = defaultdict(list)
    modules = dict(model.named_modules())
    handles = []

    def make(name: str) -> tuple[Any, Any]:
        def pre(_: torch.nn.Module, args: tuple[Any, ...]) -> None:
            calls[name] += 1
            key = name if calls[name] == 1 else f"{name}#{calls[name]}"
            open_keys[name].append(key)
            if capture in ("input", "both"):
                _store_capture(out, key, "input", args[0] if len(args) == 1 else args)

        def post(_: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
            key = open_keys[name].pop()
            if capture in ("output", "both"):
                _store_capture(out, key, "output", output)

        return pre, post

    try:
        for name in names:
            pre, post = make(name)
            handles.append(modules[name].register_forward_pre_hook(pre))
            handles.append(modules[name].register_forward_hook(post))
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return out
