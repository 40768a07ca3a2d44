"""Today's main in the same run: a temporary `git worktree` of an earlier commit to start a second server from.

Issue 12 asks for /predict at 32 clients against "today's main" (the last commit before the
issue's work, `c8b51c3`) measured in the same run: machines drift between runs by more than
the 10 % asked for. `checkout(ref, parent)` adds a detached worktree of `ref` under `parent`
(a temporary folder) and removes it again, also on errors; the benchmark starts
`python -m service` from it with the same interpreter and `PYTHONPATH` pointing at it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.server import REPO

DEFAULT_REF = "c8b51c3"  # issue 12's "today's main": the last commit before the scheduler was built


@dataclass(frozen=True)
class Checkout:
    """A worktree of `ref` (resolved to `commit`) at `path`."""

    ref: str
    commit: str
    path: Path

    @property
    def short(self) -> str:
        return self.commit[:7]


def git(repo: Path, *args: str) -> str:
    """Run git in `repo`; its stdout stripped. Raises RuntimeError with git's message when it fails."""
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise RuntimeError("git is not installed") from None
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout.strip()


def resolve(ref: str, repo: Path = REPO) -> str:
    """The full commit id `ref` names in `repo` (RuntimeError if it names none), checked before a long run starts."""
    return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")


def head_commit(repo: Path = REPO) -> str:
    """HEAD's commit id, with `+dirty` when `service/` has uncommitted changes; `unknown` outside a git checkout."""
    try:
        commit = git(repo, "rev-parse", "HEAD")
        dirty = git(repo, "status", "--porcelain", "--", "service")
    except RuntimeError:
        return "unknown"
    return commit + ("+dirty" if dirty else "")


@contextmanager
def checkout(ref: str, parent: Path, repo: Path = REPO) -> Iterator[Checkout]:
    """A detached worktree of `ref` in a new folder under `parent`; removed (and unregistered) on exit."""
    commit = resolve(ref, repo)
    parent.mkdir(parents=True, exist_ok=True)
    path = parent / f"baseline-{commit[:12]}"
    git(repo, "worktree", "add", "--detach", "--quiet", str(path), commit)
    try:
        yield Checkout(ref, commit, path)
    finally:
        remove(path, repo)


def remove(path: Path, repo: Path = REPO) -> None:
    """Remove a worktree this module added (`git worktree remove --force`); if git refuses, delete the folder
    and say so: its record is left for `git worktree prune`, which would also prune others' stale records."""
    try:
        git(repo, "worktree", "remove", "--force", str(path))
    except RuntimeError as exc:
        shutil.rmtree(path, ignore_errors=True)
        print(f"bench.baseline: deleted {path}, but {exc}; `git worktree prune` drops its record", file=sys.stderr)
