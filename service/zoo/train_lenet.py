"""Train the shipped LeNet on scikit-learn's digits: `python -m service.zoo.train_lenet [--out PATH]` (default
`./lenet_digits.pt` and `./lenet_samples/`, never the installed package).

Training tensors go through the serving path (8-bit PNG-style PIL image -> `preprocess_image`), so
serving and training see identical inputs. Adam warms up, SGD (lr 0.001, momentum 0.9) finishes, and
the SGD state is saved with the model as a training checkpoint.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from PIL import Image
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F

from service.codecs.preprocess import preprocess_image
from service.zoo.lenet import LENET_INPUT_SIZE, LeNet, lenet_preprocess_spec

TRAIN_SIZE = 1437
BATCH_SIZE = 16
SGD_LR = 0.001
SGD_MOMENTUM = 0.9
MAX_ROTATION = 0.2  # radians
MAX_SCALE = 0.1
MAX_SHIFT = 0.15  # fraction of half the image side


def digit_image(values: npt.NDArray[Any]) -> Image.Image:
    """An 8×8 digits array (0..16) as the 8-bit grayscale image a user sends: ink bright on dark."""
    return Image.fromarray(np.clip(values * 16, 0, 255).astype(np.uint8))


def digits_split() -> tuple[list[Image.Image], torch.Tensor, list[Image.Image], torch.Tensor]:
    """(train images, train labels, held-out images, held-out labels): first 1437 / last 360 digits."""
    digits = load_digits()
    images = [digit_image(v) for v in digits.images]
    labels = torch.as_tensor(digits.target, dtype=torch.long)
    return images[:TRAIN_SIZE], labels[:TRAIN_SIZE], images[TRAIN_SIZE:], labels[TRAIN_SIZE:]


def to_batch(images: Sequence[Image.Image]) -> torch.Tensor:
    """Stack images preprocessed exactly as at serving time into [N, 3, 32, 32]."""
    spec = lenet_preprocess_spec()
    return torch.stack([preprocess_image(img, spec, channels=LENET_INPUT_SIZE[0]) for img in images])


@torch.no_grad()
def augment(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random small rotation, scale and shift per image; uncovered pixels get the background value.

    Affine distortions as in Simard et al., "Best practices for convolutional neural networks applied to
    visual document analysis", ICDAR 2003.
    """
    n = len(x)
    angle = (torch.rand(n, generator=generator) * 2 - 1) * MAX_ROTATION
    scale = 1 + (torch.rand(n, generator=generator) * 2 - 1) * MAX_SCALE
    shift = (torch.rand(n, 2, generator=generator) * 2 - 1) * MAX_SHIFT
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    background = x.amin(dim=(2, 3), keepdim=True)
    return F.grid_sample(x - background, grid, align_corners=False) + background


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    return float((model(x).argmax(dim=1) == y).float().mean())


def _epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    generator: torch.Generator,
) -> float:
    """One pass in a seeded random order; returns the mean training loss."""
    model.train()
    criterion = nn.CrossEntropyLoss()
    order = torch.randperm(len(x), generator=generator)
    total = 0.0
    for start in range(0, len(x), BATCH_SIZE):
        idx = order[start : start + BATCH_SIZE]
        optimizer.zero_grad()
        loss = criterion(model(augment(x[idx], generator)), y[idx])
        loss.backward()
        optimizer.step()
        total += loss.item() * len(idx)
    return total / len(x)


def train(epochs: int = 30, sgd_epochs: int = 4, seed: int = 0) -> dict[str, Any]:
    """Train deterministically; returns the training-checkpoint dict (loadable with weights_only=True)."""
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    generator = torch.Generator().manual_seed(seed)
    train_images, y_train, heldout_images, y_heldout = digits_split()
    x_train, x_heldout = to_batch(train_images), to_batch(heldout_images)

    model = LeNet()
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    sgd = torch.optim.SGD(model.parameters(), lr=SGD_LR, momentum=SGD_MOMENTUM)
    loss = float("nan")
    for epoch in range(1, epochs + 1):
        optimizer: torch.optim.Optimizer = adam if epoch <= epochs - sgd_epochs else sgd
        loss = _epoch(model, optimizer, x_train, y_train, generator)
        print(f"epoch {epoch:2d} {type(optimizer).__name__:4s} train loss {loss:.4f}")
    heldout = accuracy(model, x_heldout, y_heldout)
    print(f"held-out accuracy {heldout:.4f} ({len(y_heldout)} digits)")
    return {
        "model_state_dict": model.state_dict(),
        "optimizer_state_dict": sgd.state_dict(),
        "epoch": epochs,
        "loss": loss,
        "heldout_accuracy": heldout,
        "arch": "LeNet",
        "dataset": "sklearn digits",
    }


def write_samples(directory: Path) -> list[Path]:
    """Save the first held-out digit of each class as `digit_<label>.png` (8×8, 8-bit grayscale)."""
    directory.mkdir(parents=True, exist_ok=True)
    _, _, images, labels = digits_split()
    written: list[Path] = []
    for label in range(10):
        index = int((labels == label).nonzero()[0])
        path = directory / f"digit_{label}.png"
        images[index].save(path, format="PNG")
        written.append(path)
    return written


def build_parser() -> argparse.ArgumentParser:
    """Everything is written under the working directory unless told otherwise: never into the installed package
    (`--out "$(python -c 'from service.zoo.lenet import weights_path; print(weights_path())')"` replaces the
    shipped checkpoint on purpose)."""
    parser = argparse.ArgumentParser(prog="python -m service.zoo.train_lenet", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("lenet_digits.pt"), help="checkpoint file to write")
    parser.add_argument("--epochs", type=int, default=30, help="total epochs (the last 4 use SGD)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples-dir", type=Path, default=Path("lenet_samples"), help="where digit_<n>.png go")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")
    torch.set_num_threads(1)
    started = time.perf_counter()
    checkpoint = train(epochs=args.epochs, sgd_epochs=min(4, args.epochs), seed=args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, args.out)
    samples = write_samples(args.samples_dir)
    elapsed = time.perf_counter() - started
    print(f"wrote {args.out} and {len(samples)} samples to {args.samples_dir} in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
