"""Saliency on half-precision models: every method answers, SmoothGrad included (Captum's noise is float32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from service.introspection.attribution import registered_methods
from service.introspection.attribution.over_tokens import TokenMapMethod
from tests.conftest import ClientFactory, tensor_input
from tests.helpers.vit import write_vit

CONFIG = """
[[models]]
name = "half"
source = "python"
architecture = "service.zoo.lenet:LeNet"
input_size = [3, 32, 32]
dtype = "{dtype}"

[[models]]
name = "half_unshared"  # DeepLift needs one module per activation call; LeNet shares its relu and pool
source = "python"
architecture = "tests.helpers.unshared_lenet:UnsharedLeNet"
input_size = [3, 32, 32]
dtype = "{dtype}"
"""

PARAMS: dict[str, dict[str, Any]] = {  # fewer samples and steps than the defaults; neuron_gradient needs a unit
    "smoothgrad": {"samples": 6},
    "gradient_shap": {"samples": 4},
    "layer_conductance": {"steps": 8},
    "layer_integrated_gradients": {"steps": 8},
    "neuron_gradient": {"neuron": [0, 4, 4]},
}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_every_method_works_in_half_precision(make_client: ClientFactory, tmp_path: Path, dtype: str) -> None:
    """Attention maps need a vision transformer: those methods run on the digits ViT in the same dtype."""
    config = CONFIG.format(dtype=dtype) + write_vit(tmp_path, "half_vit", dtype=dtype)
    client = make_client(config, smoothgrad_batch_size=4)
    x = tensor_input(torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(0)))
    for method, implementation in registered_methods().items():
        model = "half_unshared" if method == "deeplift" else "half"
        if isinstance(implementation, TokenMapMethod):
            model = "half_vit"
        extra = PARAMS.get(method, {})
        r = client.post("/saliency", json={"model": model, "inputs": [x], "method": method, **extra})
        assert r.status_code == 200, (method, r.text)
        heatmap = torch.tensor(r.json()["results"][0]["heatmap"]["data"])
        assert torch.isfinite(heatmap).all()
    assert client.get("/models/half").json()["hooks"] == 0
    assert client.get("/models/half_unshared").json()["hooks"] == 0
    assert client.get("/models/half_vit").json()["hooks"] == 0
