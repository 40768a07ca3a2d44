"""The shipped digits ViT for tests: a TOML entry serving it from a temp model dir, its inputs, and references
computed here with hooks and timm's own tools on an unfused copy of the very module the server holds."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from service.zoo.vit import DigitsViT, vit_weights_path
from tests.conftest import DIGITS_PREPROCESS
from tests.helpers.config import toml_value


def write_vit(model_dir: Path, name: str = "vit", **fields: Any) -> str:
    """Copy the shipped ViT weights into `model_dir`; the TOML entry serving them (as the built-in registry does)."""
    shutil.copyfile(vit_weights_path(), model_dir / "vit_digits.safetensors")
    settings = {"max_batch_delay_ms": 1.0} | fields
    extra = "".join(f"{key} = {toml_value(value)}\n" for key, value in settings.items())
    return f"""
[[models]]
name = "{name}"
source = "python"
architecture = "service.zoo.vit:DigitsViT"
weights = "vit_digits.safetensors"
input_size = [3, 32, 32]
{extra}{DIGITS_PREPROCESS}"""


def shipped_vit() -> DigitsViT:
    """The shipped ViT in eval mode, as it leaves the package."""
    model = DigitsViT()
    model.load_state_dict(load_file(str(vit_weights_path())))
    return model.eval()


def unfused(model: nn.Module) -> nn.Module:
    """A copy of `model` whose attention modules take the explicit softmax path (timm's `fused_attn` off)."""
    twin = copy.deepcopy(model).eval()
    for module in twin.modules():
        if hasattr(module, "fused_attn"):
            setattr(module, "fused_attn", False)  # noqa: B010 (timm's attribute, read on every forward)
    return twin


def vit_inputs(n: int, seed: int = 0, size: int = 32) -> Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def timm_attention(model: nn.Module, x: Tensor) -> dict[str, Tensor]:
    """`timm.utils.AttentionExtract` (FX: its `*attn.softmax` nodes) on an unfused copy: `{"blocks.i.attn": probs}`."""
    from timm.utils.attention_extract import AttentionExtract

    extract = AttentionExtract(unfused(model), method="fx")
    with torch.no_grad():
        found: dict[str, Tensor] = extract(x)
    return {name.removesuffix(".softmax"): t for name, t in found.items()}
