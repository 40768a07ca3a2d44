"""Model archives for the tests, made by `torch-model-archiver` itself (a dev dependency), and hostile ones by hand.

The model is a tiny image classifier (224x224 in, 10 classes out) with seeded weights, so archives
build and load in a second; `reference_model()` is the same module for expected answers.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

CLASSES = 10
MODEL_FILE = '''\
"""A tiny image classifier: the one nn.Module class TorchServe's eager loader instantiates."""
import numpy as np
import torch
from PIL import Image
from torch import nn


class TinyClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(4))
        self.head = nn.Linear(8 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))
'''
CUSTOM_HANDLER = """\
from ts.torch_handler.base_handler import BaseHandler


class MyHandler(BaseHandler):
    pass
"""
LABELS = {str(i): [f"n{i:08d}", f"class_{i}"] for i in range(CLASSES)}


def kitten() -> bytes:
    """A smooth 300x451 JPEG (resizing it is stable to the last digits, whoever resizes)."""
    y, x = np.mgrid[0:300, 0:451]
    rgb = np.stack([x * 255 // 450, y * 255 // 299, (x + y) * 255 // 750], axis=-1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="JPEG", quality=95)
    return out.getvalue()


def reference_model() -> nn.Module:
    namespace: dict[str, object] = {}
    exec(compile(MODEL_FILE, "model.py", "exec"), namespace)
    cls = namespace["TinyClassifier"]
    assert isinstance(cls, type)
    torch.manual_seed(0)
    model: nn.Module = cls()
    for p in model.parameters():  # large enough weights that the top classes are well apart
        nn.init.normal_(p, std=0.5)
    return model.eval()


def archiver(*args: str) -> None:
    """Run torch-model-archiver from this environment."""
    tool = Path(sys.executable).with_name("torch-model-archiver")
    subprocess.run([str(tool), *args], check=True, capture_output=True)


def build_sources(work: Path) -> Path:
    """model.py, weights.pt (a state dict), index_to_name.json and a TorchScript program in `work`."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "model.py").write_text(MODEL_FILE)
    model = reference_model()
    torch.save(model.state_dict(), work / "weights.pt")
    (work / "index_to_name.json").write_text(json.dumps(LABELS))
    with warnings.catch_warnings():  # torch deprecates TorchScript; TorchServe archives still carry it
        warnings.simplefilter("ignore", FutureWarning)
        traced = torch.jit.trace(model, torch.zeros(1, 3, 224, 224))  # type: ignore[no-untyped-call]
        torch.jit.save(traced, str(work / "scripted.pt"))
    (work / "my_handler.py").write_text(CUSTOM_HANDLER)
    return work


def eager_archive(work: Path, store: Path, name: str = "tiny", handler: str = "image_classifier") -> Path:
    archiver(
        "--model-name", name, "--version", "1.0", "--model-file", str(work / "model.py"),
        "--serialized-file", str(work / "weights.pt"), "--handler", handler,
        "--extra-files", str(work / "index_to_name.json"), "--export-path", str(store), "--force",
    )  # fmt: skip
    return store / f"{name}.mar"


def torchscript_archive(work: Path, store: Path, name: str = "tiny_ts") -> Path:
    archiver(
        "--model-name", name, "--version", "2.1", "--serialized-file", str(work / "scripted.pt"),
        "--handler", "image_classifier", "--export-path", str(store), "--force",
    )  # fmt: skip
    return store / f"{name}.mar"


def rewritten(source: Path, target: Path, extra: dict[str, bytes], drop: tuple[str, ...] = ()) -> Path:
    """A copy of an archive with members added (or replaced) and some dropped: for hostile archives."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            if info.filename not in drop and info.filename not in extra:
                new.writestr(info, old.read(info))
        for name, data in extra.items():
            new.writestr(name, data)
    return target


def with_symlink(source: Path, target: Path) -> Path:
    shutil.copy(source, target)
    with zipfile.ZipFile(target, "a") as archive:
        info = zipfile.ZipInfo("link.py")
        info.external_attr = 0o120777 << 16  # a symbolic link, as zip records one
        archive.writestr(info, "/etc/passwd")
    return target
