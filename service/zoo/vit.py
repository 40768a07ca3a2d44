"""A small Vision Transformer shipped trained on scikit-learn's digits: attention that means something.

timm's `VisionTransformer` (Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021) at the
LeNet's input (3 × 32 × 32, the same preprocessing): 4 × 4 patches give an 8 × 8 grid of patch tokens
after one class token, 65 tokens through 4 blocks of 4 heads (embedding 64). `service.zoo.train_vit`
trains it reproducibly.
"""

from __future__ import annotations

from pathlib import Path

from timm.models.vision_transformer import VisionTransformer

from service.zoo.lenet import LENET_INPUT_SIZE, LENET_NUM_CLASSES

VIT_INPUT_SIZE: list[int] = list(LENET_INPUT_SIZE)
VIT_PATCH = 4
VIT_EMBED_DIM = 64
VIT_DEPTH = 4
VIT_HEADS = 4

_HERE = Path(__file__).resolve().parent


class DigitsViT(VisionTransformer):
    """timm's ViT at 32 × 32 with 4 × 4 patches, 4 blocks of 4 heads; class-token pooling, as ViT-B/16 has."""

    def __init__(self, num_classes: int = LENET_NUM_CLASSES) -> None:
        super().__init__(
            img_size=VIT_INPUT_SIZE[-1],
            patch_size=VIT_PATCH,
            in_chans=VIT_INPUT_SIZE[0],
            num_classes=num_classes,
            embed_dim=VIT_EMBED_DIM,
            depth=VIT_DEPTH,
            num_heads=VIT_HEADS,
            mlp_ratio=2.0,
        )


def vit_weights_path() -> Path:
    """The shipped weights (safetensors; the training run's held-out accuracy in its metadata)."""
    return _HERE / "weights" / "vit_digits.safetensors"
