"""Train the shipped digits ViT: `python -m service.zoo.train_vit [--out PATH] [--epochs N] [--seed S]`.

The same data as the LeNet's (`service.zoo.train_lenet`): the first 1437 digits, rendered as the 8-bit images
a user sends and preprocessed by the serving path, with the same random rotations, scales and shifts; the last
360 are held out. AdamW with a linear warm-up and a cosine decay, label smoothing 0.1, deterministic on the CPU.
The weights are written as safetensors, the held-out accuracy and the recipe in its metadata.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from service.zoo.train_lenet import accuracy, augment, digits_split, to_batch
from service.zoo.vit import DigitsViT, vit_weights_path

BATCH_SIZE = 64
LR = 2e-3
WEIGHT_DECAY = 0.05
WARMUP_EPOCHS = 5
LABEL_SMOOTHING = 0.1


def learning_rate(step: int, total: int, warmup: int) -> float:
    """Linear warm-up to `LR` over `warmup` steps, then a cosine decay to zero at `total`."""
    if step < warmup:
        return LR * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return LR * 0.5 * (1.0 + math.cos(math.pi * progress))


def train(epochs: int = 150, seed: int = 0) -> tuple[dict[str, torch.Tensor], float]:
    """Train deterministically; returns (the state dict, its held-out accuracy)."""
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    generator = torch.Generator().manual_seed(seed)
    train_images, y_train, heldout_images, y_heldout = digits_split()
    x_train, x_heldout = to_batch(train_images), to_batch(heldout_images)
    model = DigitsViT()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "pos_embed" not in n and "token" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "pos_embed" not in n and "token" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}], lr=LR
    )
    criterion = nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING)
    steps_per_epoch = math.ceil(len(x_train) / BATCH_SIZE)
    total, warmup = epochs * steps_per_epoch, WARMUP_EPOCHS * steps_per_epoch
    step = 0
    for epoch in range(1, epochs + 1):
        model.train()
        order = torch.randperm(len(x_train), generator=generator)
        loss_sum = 0.0
        for start in range(0, len(x_train), BATCH_SIZE):
            idx = order[start : start + BATCH_SIZE]
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, total, warmup)
            optimizer.zero_grad()
            loss = criterion(model(augment(x_train[idx], generator)), y_train[idx])
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(idx)
            step += 1
        if epoch % 10 == 0 or epoch == epochs:
            held = accuracy(model, x_heldout, y_heldout)
            print(f"epoch {epoch:3d} train loss {loss_sum / len(x_train):.4f} held-out accuracy {held:.4f}")
    heldout = accuracy(model, x_heldout, y_heldout)
    print(f"held-out accuracy {heldout:.4f} ({len(y_heldout)} digits)")
    return {k: v.contiguous() for k, v in model.state_dict().items()}, heldout


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=vit_weights_path(), help="safetensors file to write")
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")
    torch.set_num_threads(1)
    started = time.perf_counter()
    state, heldout = train(epochs=args.epochs, seed=args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    metadata = {
        "arch": "DigitsViT",
        "dataset": "sklearn digits (first 1437 train, last 360 held out)",
        "epochs": str(args.epochs),
        "seed": str(args.seed),
        "heldout_accuracy": f"{heldout:.4f}",
    }
    save_file(state, str(args.out), metadata=metadata)
    print(f"wrote {args.out} in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
