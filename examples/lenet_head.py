"""A new head on precomputed features: logistic regression on LeNet's convolutional features of the digits.

The seeds' workflow: compute a network's convolutional features for a whole image set once,
then train a new head on them. Here the image set is scikit-learn's 1797 digits, written as
PNG files (the first 1437 to train on, the last 360 held out, as the shipped LeNet was
trained); the features are the input of `fc1`, LeNet's 400 pooled conv activations per
image, extracted over HTTP with `service.client.features.extract_features`; the head is
scikit-learn's `LogisticRegression`. Running it again resumes (nothing is recomputed).

    python -m service &       # or any hookserve serving the built-in lenet
    python examples/lenet_head.py --url http://127.0.0.1:8000 --workdir /tmp/lenet-head

needs scikit-learn (in the `dev` extra) besides hookserve.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from service.client import Client
from service.client.features import extract_features, read_features

TRAIN_SIZE = 1437


def write_digits(directory: Path) -> dict[str, int]:
    """Every digit as `train/NNNN.png` or `heldout/NNNN.png` (value × 16, bright ink on black); name -> label."""
    digits = load_digits()
    labels: dict[str, int] = {}
    for i, (values, label) in enumerate(zip(digits.images, digits.target, strict=True)):
        split = "train" if i < TRAIN_SIZE else "heldout"
        path = directory / split / f"{i:04d}.png"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.clip(values * 16, 0, 255).astype(np.uint8)).save(path)
        labels[path.as_posix()] = int(label)
    return labels


def main(argv: Sequence[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="lenet")
    parser.add_argument("--workdir", type=Path, default=Path("lenet-head"))
    args = parser.parse_args(argv)

    labels = write_digits(args.workdir / "digits")
    features_dir = args.workdir / "features"
    report = extract_features(
        args.url, [args.workdir / "digits"], features_dir, args.model, ["fc1"], capture="input", concurrency=4
    )
    print(f"features: {report.extracted} images ({report.resumed} from an earlier run), failed: {len(report.failed)}")

    names, x = read_features(features_dir, "fc1:input")  # [1797, 400]
    y = np.array([labels[name] for name in names])
    train = np.array(["/train/" in name for name in names])
    head = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    head.fit(x[train], y[train])
    accuracy = float((head.predict(x[~train]) == y[~train]).mean())

    heldout = [name for name, t in zip(names, train, strict=True) if not t]
    with Client(args.url) as client:  # LeNet's own predictions, 16 images per request
        own = [p for i in range(0, len(heldout), 16) for p in client.predict(args.model, heldout[i : i + 16]).labels()]
    lenet = float(np.mean([int(label) == labels[name] for name, label in zip(heldout, own, strict=True)]))
    print(f"held-out accuracy: logistic regression on the conv features {accuracy:.3f}, LeNet's own head {lenet:.3f}")
    return accuracy


if __name__ == "__main__":
    main()
