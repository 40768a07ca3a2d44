"""Server-side paths stay inside the model dir: `..`, absolute paths and escaping symlinks are 403."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.errors import Forbidden, NotFound
from service.registry.paths import resolve_under


@pytest.fixture
def root(tmp_path: Path) -> Path:
    model_dir = tmp_path / "models"
    (model_dir / "sub").mkdir(parents=True)
    (model_dir / "w.pt").write_bytes(b"x")
    (model_dir / "sub" / "n.pt").write_bytes(b"y")
    (tmp_path / "outside.pt").write_bytes(b"secret")
    return model_dir


def test_relative_paths_resolve_inside(root: Path) -> None:
    assert resolve_under(root, "w.pt") == (root / "w.pt").resolve()
    assert resolve_under(root, "sub/n.pt") == (root / "sub" / "n.pt").resolve()
    assert resolve_under(root, "sub/../w.pt") == (root / "w.pt").resolve()  # stays inside: allowed


@pytest.mark.parametrize("relative", ["../outside.pt", "sub/../../outside.pt", "..", "../models/../outside.pt"])
def test_dotdot_escapes_are_forbidden(root: Path, relative: str) -> None:
    with pytest.raises(Forbidden, match="outside the model dir") as info:
        resolve_under(root, relative)
    assert info.value.status == 403


def test_absolute_paths_are_forbidden(root: Path) -> None:
    with pytest.raises(Forbidden, match="absolute"):
        resolve_under(root, str((root / "w.pt").resolve()))  # even one that points inside


@pytest.mark.parametrize("relative", ["", "w.pt\x00.txt"])
def test_empty_and_nul_paths_are_forbidden(root: Path, relative: str) -> None:
    with pytest.raises(Forbidden):
        resolve_under(root, relative)


def test_symlink_out_of_the_model_dir_is_forbidden(root: Path) -> None:
    (root / "link.pt").symlink_to(root.parent / "outside.pt")
    with pytest.raises(Forbidden, match="outside the model dir"):
        resolve_under(root, "link.pt")


def test_symlink_within_the_model_dir_is_followed(root: Path) -> None:
    (root / "alias.pt").symlink_to(root / "sub" / "n.pt")
    assert resolve_under(root, "alias.pt") == (root / "sub" / "n.pt").resolve()


def test_missing_files_and_directories_are_not_found(root: Path) -> None:
    with pytest.raises(NotFound, match=r"no file 'nope\.pt'") as info:
        resolve_under(root, "nope.pt")
    assert info.value.status == 404
    with pytest.raises(NotFound):
        resolve_under(root, "sub")
    assert resolve_under(root, "nope.pt", must_exist=False) == (root / "nope.pt").resolve()


def test_messages_do_not_reveal_server_paths(root: Path) -> None:
    for relative in ("../outside.pt", "nope.pt", "/etc/passwd"):
        with pytest.raises((Forbidden, NotFound)) as info:
            resolve_under(root, relative)
        assert str(root) not in str(info.value.detail)
        assert str(root.parent) not in str(info.value.detail)
