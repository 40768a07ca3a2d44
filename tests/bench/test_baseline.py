"""Today's main as a temporary worktree: created from a ref, run from, removed again (in a throwaway repo)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import baseline
from bench.server import REPO, Server, ServerConfig

IDENTITY = ("-c", "user.name=bench test", "-c", "user.email=bench@example.invalid")


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *IDENTITY, *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with two commits of a `service` package: `old` says 1, the head says 2."""
    root = tmp_path / "repo"
    (root / "service").mkdir(parents=True)
    _git(root, "init", "--quiet")
    for version in (1, 2):
        (root / "service" / "__init__.py").write_text(f"VERSION = {version}\n")
        _git(root, "add", "service")
        _git(root, "commit", "--quiet", "-m", f"version {version}")
        if version == 1:
            _git(root, "tag", "old")
    return root


def _worktrees(repo: Path) -> list[Path]:
    lines = _git(repo, "worktree", "list", "--porcelain").splitlines()
    return [Path(line.removeprefix("worktree ")).resolve() for line in lines if line.startswith("worktree ")]


def test_a_checkout_is_the_ref_and_is_removed_afterwards(repo: Path, tmp_path: Path) -> None:
    parent = tmp_path / "run"
    with baseline.checkout("old", parent, repo) as before:
        assert before.commit == _git(repo, "rev-parse", "old")
        assert before.short == before.commit[:7]
        assert before.path.parent == parent
        assert (before.path / "service" / "__init__.py").read_text() == "VERSION = 1\n"
        assert before.path.resolve() in _worktrees(repo)
        assert _git(before.path, "status", "--porcelain") == ""
    assert not before.path.exists()
    assert _worktrees(repo) == [repo.resolve()]
    assert (repo / "service" / "__init__.py").read_text() == "VERSION = 2\n"  # the main checkout untouched


def test_the_worktree_is_removed_when_the_measurement_fails(repo: Path, tmp_path: Path) -> None:
    seen: list[Path] = []

    def measure() -> None:
        with baseline.checkout("old", tmp_path / "run", repo) as before:
            seen.append(before.path)
            (before.path / "server.log").write_text("left behind by a server\n")  # untracked files too
            raise RuntimeError("the server died")

    with pytest.raises(RuntimeError, match="server died"):
        measure()
    assert seen
    assert not seen[0].exists()
    assert _worktrees(repo) == [repo.resolve()]


def test_an_unknown_ref_is_refused_before_anything_is_created(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="rev-parse"), baseline.checkout("no-such-ref", tmp_path / "run", repo):
        pass
    assert not (tmp_path / "run").exists()
    assert _worktrees(repo) == [repo.resolve()]


def test_head_commit_says_when_service_has_uncommitted_changes(repo: Path, tmp_path: Path) -> None:
    head = _git(repo, "rev-parse", "HEAD")
    (repo / "notes.txt").write_text("not the served package\n")
    assert baseline.head_commit(repo) == head
    (repo / "service" / "__init__.py").write_text("VERSION = 3\n")
    assert baseline.head_commit(repo) == head + "+dirty"
    assert baseline.head_commit(tmp_path / "not-a-repo") == "unknown"


def test_the_default_ref_names_a_commit_of_this_repository() -> None:
    try:
        shallow = baseline.git(REPO, "rev-parse", "--is-shallow-repository") == "true"
    except RuntimeError:
        pytest.skip("not a git checkout")
    if shallow:
        pytest.skip("a shallow clone lacks the history the default ref names")
    assert baseline.resolve(baseline.DEFAULT_REF).startswith(baseline.DEFAULT_REF)


def test_a_server_from_a_checkout_imports_that_checkouts_package(repo: Path, tmp_path: Path) -> None:
    """The venv's editable install points at another checkout; cwd and PYTHONPATH must win over it."""
    cfg = ServerConfig("default@old", "today's main", {"HOOKSERVE_MAX_BATCH_SIZE": "8"})
    with baseline.checkout("old", tmp_path / "run", repo) as before:
        server = Server(cfg, 0, tmp_path / "work", source=before.path)
        assert server.environment()["PYTHONPATH"] == str(before.path)
        assert server.environment()["HOOKSERVE_MAX_BATCH_SIZE"] == "8"
        assert server.service_origin() == before.path.resolve()
