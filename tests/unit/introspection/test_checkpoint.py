"""inspect_checkpoint: formats, nesting, compare, and refusing pickles that need code (nothing runs)."""

from __future__ import annotations

import io
import os
import pathlib
import pickle
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from service.errors import BadInput, InvalidField
from service.introspection.checkpoint import REFUSED, inspect_checkpoint
from service.introspection.checkpoint_scan import CheckpointLimits
from service.introspection.optimizer import optimizer_metadata
from service.introspection.state_dict import checkpoint_state_dict_entries


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))


class Armed:
    """Unpickling this touches `marker`: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (pathlib.Path.touch, (self.marker,))


def test_bare_state_dict(tmp_path: Path) -> None:
    sd = _model().state_dict()
    path = tmp_path / "bare.pt"
    torch.save(sd, path)
    got = inspect_checkpoint(path)
    assert got == {
        "format": "pickle",
        "state_dicts": {"": checkpoint_state_dict_entries(sd, stats=False)},
        "optimizers": {},
        "other": {},
        "compare": None,
    }
    assert got["state_dicts"][""]["total_numel"] == 18 + 2 + 2 + 2 + 2 + 2 + 1 + 24 + 3


def test_training_checkpoint(tmp_path: Path) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.randn(2, 1, 4, 4)).sum().backward()
    opt.step()
    path = tmp_path / "train.pt"
    torch.save(
        {
            "epoch": 7,
            "loss": torch.tensor(0.25),
            "model_state_dict": model.state_dict(),
            "optimizer_state_dict": opt.state_dict(),
            "config": {"name": "lenet", "tags": ["a", "b"], "dropout": None, "fast": True},
        },
        path,
    )
    got = inspect_checkpoint(path, compare_to=_model())
    assert list(got["state_dicts"]) == ["model_state_dict"]
    names = dict(enumerate(name for name, _ in model.named_parameters()))
    assert got["optimizers"] == {"optimizer_state_dict": optimizer_metadata(None, opt.state_dict(), names)}
    assert got["optimizers"]["optimizer_state_dict"]["state"][0]["param_name"] == "0.weight"
    assert got["other"] == {
        "epoch": 7,
        "loss": 0.25,
        "config.name": "lenet",
        "config.tags": ["a", "b"],
        "config.dropout": None,
        "config.fast": True,
    }
    assert got["compare"] == {"missing_keys": [], "unexpected_keys": [], "shape_mismatches": []}


def test_without_a_preferred_key_the_largest_state_dict_is_the_models(tmp_path: Path) -> None:
    """No `model`/`state_dict` key: the state dict holding the most elements is compared, whatever its name."""
    path = tmp_path / "named.pt"
    torch.save({"big": _model().state_dict(), "tiny": {"scale": torch.ones(1)}}, path)
    got = inspect_checkpoint(path, compare_to=_model())
    assert got["compare"] == {"missing_keys": [], "unexpected_keys": [], "shape_mismatches": []}


def test_two_optimizers_are_not_given_the_models_parameter_names(tmp_path: Path) -> None:
    """With two optimizers (a GAN's), which parameters each one holds is unknown: no param_name is guessed."""
    model = _model()
    first = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    second = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.5)
    model(torch.randn(2, 1, 4, 4)).sum().backward()
    first.step()
    second.step()
    path = tmp_path / "two.pt"
    torch.save({"model": model.state_dict(), "g_opt": first.state_dict(), "d_opt": second.state_dict()}, path)
    got = inspect_checkpoint(path)
    assert got["optimizers"] == {
        "g_opt": optimizer_metadata(None, first.state_dict(), None),
        "d_opt": optimizer_metadata(None, second.state_dict(), None),
    }
    assert got["optimizers"]["g_opt"]["state"][0]["param_name"] is None


def test_nested_state_dicts_and_lists(tmp_path: Path) -> None:
    sd = _model().state_dict()
    path = tmp_path / "nested.pt"
    torch.save({"model": {"state_dict": sd, "version": "1.2"}, "ema": [{"w": torch.ones(2)}]}, path)
    got = inspect_checkpoint(path, compare_to=_model())
    assert list(got["state_dicts"]) == ["model.state_dict", "ema.0"]
    assert got["state_dicts"]["ema.0"]["entries"][0]["key"] == "w"
    assert got["other"] == {"model.version": "1.2"}
    assert got["compare"]["missing_keys"] == []  # compared with model.state_dict, not ema.0


def test_legacy_serialization(tmp_path: Path) -> None:
    path = tmp_path / "legacy.pt"
    torch.save({"state_dict": _model().state_dict(), "step": 3}, path, _use_new_zipfile_serialization=False)
    got = inspect_checkpoint(path)
    assert got["other"] == {"step": 3}
    assert got["state_dicts"]["state_dict"]["num_tensors"] == 9


def test_compare_reports_missing_unexpected_and_mismatched(tmp_path: Path) -> None:
    sd = _model().state_dict()
    del sd["3.bias"]
    sd["extra.weight"] = torch.zeros(1)
    sd["0.weight"] = torch.zeros(2, 1, 5, 5)
    path = tmp_path / "off.pt"
    torch.save({"state_dict": sd}, path)
    got = inspect_checkpoint(path, compare_to=_model())
    assert got["compare"] == {
        "missing_keys": ["3.bias"],
        "unexpected_keys": ["extra.weight"],
        "shape_mismatches": [{"key": "0.weight", "checkpoint_shape": [2, 1, 5, 5], "model_shape": [2, 1, 3, 3]}],
    }


def test_safetensors_with_metadata(tmp_path: Path) -> None:
    sd = {k: v.contiguous() for k, v in _model().state_dict().items()}
    path = tmp_path / "model.safetensors"
    save_file(sd, str(path), metadata={"format": "pt", "epoch": "7"})
    got = inspect_checkpoint(path, compare_to=_model())
    assert got["format"] == "safetensors"
    assert got["other"] == {"metadata": {"format": "pt", "epoch": "7"}}
    expected = checkpoint_state_dict_entries(sd, stats=False)
    assert sorted(got["state_dicts"][""]["entries"], key=lambda e: e["key"]) == sorted(
        expected["entries"], key=lambda e: e["key"]
    )
    assert got["state_dicts"][""]["total_numel"] == expected["total_numel"]
    assert got["compare"] == {"missing_keys": [], "unexpected_keys": [], "shape_mismatches": []}
    with_stats = inspect_checkpoint(path, stats=True)
    entry = next(e for e in with_stats["state_dicts"][""]["entries"] if e["key"] == "1.running_var")
    assert (entry["min"], entry["max"], entry["nan_count"]) == (1.0, 1.0, 0)


def test_safetensors_content_wins_over_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    save_file({"w": torch.ones(2)}, str(path))
    assert inspect_checkpoint(path)["format"] == "safetensors"
    pickled = tmp_path / "named.safetensors"
    torch.save({"w": torch.ones(2)}, pickled)
    assert inspect_checkpoint(pickled)["state_dicts"][""]["total_numel"] == 2


def _assert_refused(path: Path, marker: Path) -> None:
    with pytest.raises(InvalidField) as info:
        inspect_checkpoint(path)
    assert info.value.status == 422
    assert info.value.detail == REFUSED
    assert not marker.exists()


def test_malicious_torch_saves_are_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = {"state_dict": {"w": torch.ones(1)}, "evil": Armed(marker)}
    zipped = tmp_path / "evil.pt"
    torch.save(payload, zipped)
    torch.load(zipped, weights_only=False)  # the payload is live: unrestricted unpickling runs it
    assert marker.exists()
    marker.unlink()
    _assert_refused(zipped, marker)

    legacy = tmp_path / "evil_legacy.pt"
    torch.save(payload, legacy, _use_new_zipfile_serialization=False)
    _assert_refused(legacy, marker)


# torch's weights-only unpickler warns about any protocol but 2 (torch.save's) before reading on.
@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_plain_malicious_pickle_is_refused(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "pwned"
    armed = pickle.dumps({"state_dict": {"w": torch.ones(1)}, "evil": Armed(marker)}, protocol=protocol)
    pickle.loads(armed)
    assert marker.exists()
    marker.unlink()
    plain = tmp_path / "evil.pkl"
    plain.write_bytes(armed)
    _assert_refused(plain, marker)


def test_os_system_payload_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Shell:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "shell.pt"
    torch.save([Shell()], path)
    _assert_refused(path, marker)


def test_torchscript_archive_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "scripted.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({}))
        archive.writestr("archive/constants.pkl", pickle.dumps(()))
        archive.writestr("archive/code/__torch__.py", "def forward(self): ...")
    with pytest.raises(InvalidField, match="TorchScript"):
        inspect_checkpoint(path)


def test_a_torchscript_archive_with_its_files_at_the_root_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "flat.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("data.pkl", pickle.dumps({}))
        archive.writestr("constants.pkl", pickle.dumps(()))
    with pytest.raises(InvalidField, match="TorchScript"):
        inspect_checkpoint(path)


@pytest.mark.parametrize(
    "content",
    [
        os.urandom(4096),
        b"",
        b"\x80\x04garbage that is not a pickle",
        b"PK\x03\x04 but not a zip",
        b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}",
    ],
    ids=["random", "empty", "bad-pickle", "bad-zip", "bad-safetensors-header"],
)
def test_not_a_checkpoint_is_bad_input(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "junk.bin"
    path.write_bytes(content)
    with pytest.raises(BadInput) as info:
        inspect_checkpoint(path)
    assert info.value.status == 400
    assert str(tmp_path) not in str(info.value.detail)


def test_zip_without_a_torch_pickle_and_plain_values(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("readme.txt", "hello")
    path = tmp_path / "other.zip"
    path.write_bytes(buffer.getvalue())
    with pytest.raises(BadInput):
        inspect_checkpoint(path)

    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps({"epoch": 3}, protocol=2))  # a pickle, but not torch.save's format
    with pytest.raises(BadInput):
        inspect_checkpoint(plain)


def test_long_lists_are_summarised(tmp_path: Path) -> None:
    path = tmp_path / "history.pt"
    deep: list[Any] = [1]
    for _ in range(100):
        deep = [deep, torch.ones(1)]
    saved = {
        "losses": [float(i) for i in range(5000)],
        "shape": torch.Size([2, 3]),
        "w": {},
        "bad": [float("nan"), float("-inf")],
        "deep": deep,
    }
    torch.save(saved, path)
    got = inspect_checkpoint(path, limits=CheckpointLimits(depth=256))  # the walk stops at 64 on its own
    assert got["other"]["losses"] == {"length": 5000, "first": [float(i) for i in range(16)]}
    assert got["other"]["bad"] == ["nan", "-inf"]
    assert got["other"]["deep.1"] == 1.0
    assert got["other"]["deep" + ".0" * 64] == "(nested deeper than 64 levels)"
    assert got["other"]["shape"] == [2, 3]
    assert got["other"]["w"] == {}
    assert got["state_dicts"] == {}


def test_a_one_element_complex_tensor_is_shown_as_its_value(tmp_path: Path) -> None:
    path = tmp_path / "complex.pt"
    torch.save({"z": torch.tensor(1.5 - 2j), "epoch": 3}, path)  # not all tensors: no state dict
    got = inspect_checkpoint(path)
    assert got["other"]["z"] == "(1.5-2j)"  # a complex is no JSON number: its Python text
