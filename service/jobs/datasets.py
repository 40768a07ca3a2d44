"""Data sets a job reads: scikit-learn's `digits` (built in, offline) or an image folder under the data dir.

An image folder holds one subfolder per class (sorted names give labels 0, 1, ...); its samples are
the image files in them, in sorted order, so a job that resumes sees the same order.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from service.codecs.images import image_to_tensor
from service.codecs.preprocess import preprocess_image
from service.errors import BadInput, Forbidden, InvalidField, NotFound
from service.registry.loaded import LoadedModel
from service.registry.paths import resolve_under

DIGITS = "digits"
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
MAX_FILES = 1_000_000


@dataclass(frozen=True)
class Loaded:
    """A chunk's readable samples as one batch, their data-set indices, and the samples that failed."""

    inputs: torch.Tensor | None
    indices: list[int]
    failed: list[tuple[int, str]]  # (index, why)


class Dataset:
    """Samples by index: their label, file (if any), and the model's input tensor."""

    name: str
    classes: list[str]

    def __len__(self) -> int:
        raise NotImplementedError

    def label(self, index: int) -> int:
        raise NotImplementedError

    def file(self, index: int) -> str | None:
        return None

    def sample(self, index: int, model: LoadedModel, max_pixels: int) -> torch.Tensor:
        raise NotImplementedError

    def load(self, indices: Sequence[int], model: LoadedModel, max_pixels: int) -> Loaded:
        """The samples at `indices` as one batch; an unreadable one (or one whose preprocessed shape
        differs from the rest) is listed, not fatal."""
        samples: list[torch.Tensor] = []
        kept: list[int] = []
        failed: list[tuple[int, str]] = []
        for index in indices:
            try:
                x = self.sample(index, model, max_pixels)
            except BadInput as exc:
                failed.append((index, str(exc.detail)))
                continue
            if samples and x.shape != samples[0].shape:
                failed.append((index, f"preprocessed to shape {list(x.shape)}, not {list(samples[0].shape)}"))
                continue
            samples.append(x)
            kept.append(index)
        return Loaded(torch.stack(samples) if samples else None, kept, failed)


@functools.cache
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits  # bundled with scikit-learn: nothing is downloaded

    digits = load_digits()
    return digits.images, digits.target


class Digits(Dataset):
    """scikit-learn's 1797 8×8 digits, as the 8-bit grayscale images (ink bright on dark) a client sends."""

    def __init__(self) -> None:
        self.name = DIGITS
        self.classes = [str(i) for i in range(10)]

    def __len__(self) -> int:
        return len(_digits()[1])

    def label(self, index: int) -> int:
        return int(_digits()[1][index])

    def sample(self, index: int, model: LoadedModel, max_pixels: int) -> torch.Tensor:
        values = _digits()[0][index]
        image = Image.fromarray(np.clip(values * 16, 0, 255).astype(np.uint8))
        return preprocess_image(image, model.preprocess, model.channels)


class ImageFolder(Dataset):
    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.root = root
        self.classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not self.classes:
            raise InvalidField(f"dataset {name!r} has no class subfolders; put its images in <dataset>/<class>/")
        self._files: list[tuple[str, int]] = []
        for label, cls in enumerate(self.classes):
            for path in sorted((root / cls).rglob("*")):
                if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
                    self._files.append((str(path.relative_to(root)), label))
                    if len(self._files) > MAX_FILES:
                        raise InvalidField(f"dataset {name!r} holds more than {MAX_FILES} images")
        if not self._files:
            raise InvalidField(
                f"dataset {name!r} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in its class subfolders"
            )

    def __len__(self) -> int:
        return len(self._files)

    def label(self, index: int) -> int:
        return self._files[index][1]

    def file(self, index: int) -> str | None:
        return self._files[index][0]

    def sample(self, index: int, model: LoadedModel, max_pixels: int) -> torch.Tensor:
        relative = self._files[index][0]
        try:  # a file swapped for a link that leaves the data set since it was listed is refused too
            path = resolve_under(self.root, relative, where=f"dataset {self.name!r}")
            data = path.read_bytes()
        except (OSError, Forbidden, NotFound) as exc:
            raise BadInput(f"{relative} could not be read ({type(exc).__name__})") from None
        return image_to_tensor(data, model.preprocess, model.channels, max_pixels, relative)


def open_dataset(name: str, data_dir: Path | None) -> Dataset:
    """`digits`, or the folder `name` under the data dir (403 outside it or without one, 404 missing, 422 empty)."""
    if name == DIGITS:
        return Digits()
    if data_dir is None:
        raise Forbidden(f"dataset {name!r}: no data dir is configured (HOOKSERVE_DATA_DIR); only 'digits' is built in")
    root = resolve_under(data_dir, name, must_exist=False, where="the data dir")
    if not root.is_dir():
        raise NotFound(f"no dataset folder {name!r} under the data dir")
    return ImageFolder(name, root)
