"""Architecture builders (torchvision, timm, Python classes) and the optional optimizer."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from service.errors import ModelLoadError
from service.registry.optimizers import build_optimizer
from service.registry.sources import build_module, register_source, registered_sources
from service.specs.model import ModelSpec, OptimizerSpec, Source
from service.zoo.lenet import LeNet

TINY_FILE = """
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self, width: int = 2) -> None:
        super().__init__()
        self.fc = nn.Linear(4, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def not_a_class() -> None:
    pass
"""


def _spec(source: str, architecture: str, **fields: Any) -> ModelSpec:
    return ModelSpec.model_validate({"name": "m", "source": source, "architecture": architecture, **fields})


def test_torchvision_passes_kwargs(tmp_path: Path) -> None:
    module = build_module(_spec("torchvision", "resnet18", kwargs={"num_classes": 7}), tmp_path, False)
    import torchvision

    assert isinstance(module, torchvision.models.ResNet)
    assert module.fc.out_features == 7


def test_timm_passes_kwargs(tmp_path: Path) -> None:
    module = build_module(_spec("timm", "test_vit", kwargs={"num_classes": 3}), tmp_path, False)
    with torch.inference_mode():
        out = module.eval()(torch.zeros(1, 3, 160, 160))
    assert out.shape == (1, 3)


def test_timm_features_only_returns_feature_maps(tmp_path: Path) -> None:
    module = build_module(_spec("timm", "efficientvit_b0", kwargs={"features_only": True}), tmp_path, False)
    with torch.inference_mode():
        out = module.eval()(torch.zeros(1, 3, 224, 224))
    assert isinstance(out, list)
    assert len(out) == 4
    assert [o.shape[-1] for o in out] == [224 // 4, 224 // 8, 224 // 16, 224 // 32]


def test_python_module_form(tmp_path: Path) -> None:
    module = build_module(_spec("python", "service.zoo.lenet:LeNet", kwargs={"num_classes": 4}), tmp_path, False)
    assert type(module) is LeNet
    assert isinstance(module.fc3, nn.Linear)
    assert module.fc3.out_features == 4


def test_python_file_form_under_the_model_dir(tmp_path: Path) -> None:
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "tiny.py").write_text(TINY_FILE)
    module = build_module(_spec("python", "nets/tiny.py:Tiny", kwargs={"width": 5}), tmp_path, False)
    assert type(module).__name__ == "Tiny"
    assert module(torch.zeros(2, 1, 2, 2)).shape == (2, 5)


@pytest.mark.parametrize(
    ("source", "architecture", "needle"),
    [
        ("torchvision", "resnet19", "torchvision has no model 'resnet19'; closest: ['resnet18'"),
        ("timm", "test_vitt", "timm has no model 'test_vitt'; closest: ['test_vit'"),
        ("python", "no_colon_here", "must be 'pkg.module:Class' or 'file.py:Class'"),
        ("python", ":LeNet", "must be 'pkg.module:Class'"),
        ("python", "service.zoo.lenet:", "must be 'pkg.module:Class'"),
        ("python", "service.zoo.nothing_here:LeNet", "cannot import module 'service.zoo.nothing_here'"),
        ("python", "service.zoo.lenet:load_lenet", "is not an nn.Module class"),
        ("python", "service.zoo.lenet:Missing", "is not an nn.Module class"),
        ("python", "tiny.py:not_a_class", "is not an nn.Module class"),
        ("python", "../tiny.py:Tiny", "resolves outside the model dir"),
        ("python", "absent.py:Tiny", "no file 'absent.py'"),
    ],
)
def test_unknown_architectures_fail_with_a_hint(tmp_path: Path, source: str, architecture: str, needle: str) -> None:
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    (model_dir / "tiny.py").write_text(TINY_FILE)
    (tmp_path / "tiny.py").write_text(TINY_FILE)  # exists, but outside the model dir
    with pytest.raises(ModelLoadError) as info:
        build_module(_spec(source, architecture), model_dir, False)
    assert needle in str(info.value)


@pytest.mark.parametrize(("source", "architecture"), [("torchvision", "resnet18"), ("timm", "test_vit")])
def test_default_weights_without_downloads_fail_before_any_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, architecture: str
) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the network was touched")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)
    with pytest.raises(ModelLoadError, match="downloads, which are disabled") as info:
        build_module(_spec(source, architecture, weights="DEFAULT"), tmp_path, False)
    assert "HOOKSERVE_ALLOW_DOWNLOADS" in str(info.value)


def test_default_weights_are_only_for_libraries(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="only for torchvision and timm"):
        build_module(_spec("python", "service.zoo.lenet:LeNet", weights="DEFAULT"), tmp_path, True)


def test_optimizer_absent_unless_needed() -> None:
    module = nn.Linear(2, 2)
    spec = _spec("python", "x:Y")
    assert build_optimizer(spec, module, needed=False) is None
    fallback = build_optimizer(spec, module, needed=True)
    assert type(fallback) is torch.optim.SGD
    assert fallback.param_groups[0]["params"] == list(module.parameters())


def test_configured_optimizer_gets_its_kwargs() -> None:
    module = nn.Linear(2, 2)
    spec = _spec("python", "x:Y").model_copy(
        update={"optimizer": OptimizerSpec.model_validate({"type": "Adam", "lr": 0.01, "betas": [0.8, 0.9]})}
    )
    optimizer = build_optimizer(spec, module, needed=False)
    assert type(optimizer) is torch.optim.Adam
    group = optimizer.param_groups[0]
    assert group["lr"] == 0.01
    assert tuple(group["betas"]) == (0.8, 0.9)


@pytest.mark.parametrize(
    ("optimizer", "needle"),
    [
        ({"type": "Nope"}, "no optimizer 'Nope'"),
        ({"type": "Optimizer"}, "optimizer Optimizer"),
        ({"type": "SGD", "zzz": 1}, "zzz"),
    ],
)
def test_bad_optimizers_fail(optimizer: dict[str, Any], needle: str) -> None:
    spec = _spec("python", "x:Y").model_copy(update={"optimizer": OptimizerSpec.model_validate(optimizer)})
    with pytest.raises(ModelLoadError, match=needle):
        build_optimizer(spec, nn.Linear(2, 2), needed=False)


def test_source_enum_is_closed() -> None:
    assert {s.value for s in Source} == {"torchvision", "timm", "python", "torchscript"}


def test_every_source_has_exactly_one_builder() -> None:
    assert set(registered_sources()) == set(Source)


def test_a_source_registered_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register_source(Source.timm)(lambda spec, root, pretrained: torch.nn.Identity())
