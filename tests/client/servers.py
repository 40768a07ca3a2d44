"""Live servers for the client and command-line tests: a real `python -m service` on loopback.

`serve_lenet` serves the shipped LeNet and digits ViT (as a user's config would) beside the
reliability tests' `slow` model, with an admin token and a small `max_inputs`, so that every error
status a client maps can be provoked. `held_out_digits` writes the 360 held-out digits of
scikit-learn's data set (the split `service.zoo.train_lenet` trains with) as PNG files.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

from tests.conftest import write_lenet
from tests.helpers.vit import write_vit
from tests.reliability.live_server import LiveServer, write_slow

TOKEN = "client-test-token"
MAX_INPUTS = 16
HELD_OUT = 360  # the last 360 digits (train_lenet.TRAIN_SIZE = 1437 of 1797)


def serve_lenet(model_dir: Path, **env: str) -> LiveServer:
    """An unstarted LiveServer over lenet, vit_digits (named as the built-in, so the README's lines run) and slow;
    use it as a context manager."""
    config = (
        write_lenet(model_dir) + write_slow(model_dir) + write_vit(model_dir, "vit_digits", labels="digits_labels.txt")
    )
    settings = {"HOOKSERVE_ADMIN_TOKEN": TOKEN, "HOOKSERVE_MAX_INPUTS": str(MAX_INPUTS), **env}
    return LiveServer(model_dir, config, env=settings)


def digit_png(values: np.ndarray, path: Path) -> None:
    """An 8×8 digit as the data set draws it (value × 16, bright ink on black), saved as a grayscale PNG."""
    Image.fromarray(np.clip(values.reshape(8, 8) * 16, 0, 255).astype(np.uint8), mode="L").save(path)


def held_out_digits(directory: Path) -> list[tuple[Path, int]]:
    """Write the held-out digits as `<index>.png` into `directory`; (path, label) of each, in file order."""
    directory.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    out = []
    for i, (values, label) in enumerate(zip(digits.data[-HELD_OUT:], digits.target[-HELD_OUT:], strict=True)):
        path = directory / f"{i:04d}.png"
        digit_png(values, path)
        out.append((path, int(label)))
    return out


def slow_tensor(delay: float) -> np.ndarray:
    """The slow model's input as a tensor: it sleeps `delay` seconds."""
    x = np.zeros((1, 4, 4), dtype=np.float32)
    x.flat[0] = delay
    return x


def queue_depth(base_url: str, model: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    match = re.search(rf'^hookserve_queue_depth\{{model="{model}"\}} (\S+)$', text, re.MULTILINE)
    assert match, "hookserve_queue_depth not in /metrics"
    return float(match.group(1))


def hooks(base_url: str, model: str) -> int:
    count: int = httpx.get(f"{base_url}/models/{model}", timeout=5).json()["hooks"]
    return count
