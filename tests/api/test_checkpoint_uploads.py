"""POST /checkpoints/inspect uploads on disk: written once, bounded in number and bytes, removed on every path."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient
from safetensors.torch import save

from service.api.uploads import SCRATCH_PREFIX, UploadSlots
from service.config import Settings
from service.main import create_app
from tests.conftest import wait_settled, write_lenet
from tests.helpers.serving import uvicorn_thread
from tests.helpers.waiting import wait_until

KiB = 1024
BOUNDARY = "hookserveupload"


def checkpoint(size: int) -> bytes:
    """A safetensors file of about `size` bytes (one float32 tensor)."""
    return save({"w": torch.arange(size // 4, dtype=torch.float32)})


def envelope(data: bytes) -> tuple[bytes, bytes]:
    """The multipart body around `data` as one `file` part: (what comes before it, what comes after it)."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="w.safetensors"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return head, f"\r\n--{BOUNDARY}--\r\n".encode()


@pytest.fixture
def scratch_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory of this test's server: every spool or scratch file lands here."""
    parent = tmp_path / "tmp"
    parent.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(parent))
    return parent


def app_of(tmp_path: Path, **overrides: Any) -> FastAPI:
    (tmp_path / "models.toml").write_text(write_lenet(tmp_path))
    return create_app(Settings(model_dir=tmp_path, config=tmp_path / "models.toml", worker_threads=1, **overrides))


def slots(app: FastAPI) -> UploadSlots:
    found: UploadSlots = app.state.hookserve.uploads
    return found


def scratch_files(parent: Path) -> list[Path]:
    return [p for p in parent.rglob("*") if p.is_file()]


def written_bytes() -> int:
    """Bytes this process has passed to write(2) so far, to any file (Linux /proc/self/io `wchar`)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


def test_an_upload_is_written_to_disk_once(tmp_path: Path, scratch_parent: Path) -> None:
    """The process writes the upload's bytes once (into the file torch reads), not a spooled copy and then the file;
    the app runs in this process (TestClient), so its writes are this process's."""
    data = checkpoint(32 * 1024 * KiB)  # far past the 1 MiB a form parser keeps in memory before spooling to disk
    with TestClient(app_of(tmp_path)) as client:
        wait_settled(client)
        before = written_bytes()
        response = client.post("/checkpoints/inspect", files={"file": ("w.safetensors", data)})
        written = written_bytes() - before
        assert response.status_code == 200, response.text
        assert response.json()["state_dicts"][""]["entries"][0]["shape"] == [32 * 1024 * KiB // 4]
    assert len(data) <= written < 1.25 * len(data)


def test_scratch_is_removed_after_success_and_error_and_at_shutdown(tmp_path: Path, scratch_parent: Path) -> None:
    with TestClient(app_of(tmp_path)) as client:
        wait_settled(client)
        ok = client.post("/checkpoints/inspect", files={"file": ("w.safetensors", checkpoint(64 * KiB))})
        assert ok.status_code == 200, ok.text
        assert scratch_files(scratch_parent) == []
        bad = client.post("/checkpoints/inspect", files={"file": ("w.pt", b"not a checkpoint" * 100)})
        assert 400 <= bad.status_code < 500, bad.text
        assert scratch_files(scratch_parent) == []
        root = slots(client.app).root  # type: ignore[arg-type]
        assert root.parent == scratch_parent
        assert root.exists()
    assert not root.exists(), "the scratch directory outlived the server"


def test_a_dead_servers_scratch_is_removed_at_start(tmp_path: Path, scratch_parent: Path) -> None:
    dead = subprocess_pid_that_exited()
    orphan = scratch_parent / f"{SCRATCH_PREFIX}{dead}-abc" / "upload-x"
    orphan.mkdir(parents=True)
    (orphan / "checkpoint").write_bytes(b"left by a server killed mid-upload")
    alive = scratch_parent / f"{SCRATCH_PREFIX}{os.getpid()}-def"
    alive.mkdir()
    with TestClient(app_of(tmp_path)):
        assert not orphan.parent.exists()
        assert alive.exists(), "a running server's scratch was removed"


def subprocess_pid_that_exited() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


class PartialUpload:
    """An upload over a raw socket: headers and the start of the file now, the rest (or nothing) later."""

    def __init__(self, base_url: str, data: bytes, *, declared: bool = True) -> None:
        host, port = base_url.removeprefix("http://").split(":")
        self.head, self.tail = envelope(data)
        self.data = data
        self.declared = declared
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        length = len(self.head) + len(data) + len(self.tail)
        framing = f"Content-Length: {length}" if declared else "Transfer-Encoding: chunked"
        self.sock.sendall(
            f"POST /checkpoints/inspect HTTP/1.1\r\nHost: {host}\r\n{framing}\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n\r\n".encode()
        )
        self._send(self.head + data[: len(data) // 2])

    def _send(self, piece: bytes) -> None:
        self.sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if not self.declared else piece)

    def finish(self) -> tuple[int, bytes]:
        self._send(self.data[len(self.data) // 2 :] + self.tail)
        if not self.declared:
            self.sock.sendall(b"0\r\n\r\n")
        return self.answer()

    def answer(self) -> tuple[int, bytes]:
        """The server's status line and headers, with as much of the body as came with them."""
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += self.sock.recv(65536)
        self.sock.close()
        return int(answer.split(b" ", 2)[1]), answer

    def abandon(self) -> None:
        self.sock.close()


@pytest.fixture
def served(tmp_path: Path, scratch_parent: Path) -> Iterator[tuple[FastAPI, str]]:
    app = app_of(tmp_path, max_concurrent_uploads=1, max_upload_scratch_bytes=4 * 1024 * KiB)
    with uvicorn_thread(app) as url:
        wait_until(lambda: httpx.get(f"{url}/readyz").status_code == 200, "the server to be ready")
        yield app, url


def test_uploads_past_max_concurrent_uploads_get_503_with_retry_after(served: tuple[FastAPI, str]) -> None:
    app, url = served
    first = PartialUpload(url, checkpoint(64 * KiB))
    wait_until(lambda: slots(app).active == 1, "the first upload to start")
    second = httpx.post(f"{url}/checkpoints/inspect", files={"file": ("w.safetensors", checkpoint(8 * KiB))})
    assert second.status_code == 503, second.text
    assert "max_concurrent_uploads" in second.json()["detail"]
    assert int(second.headers["retry-after"]) >= 1
    status, _ = first.finish()
    assert status == 200
    assert httpx.post(f"{url}/checkpoints/inspect", files={"file": ("w.safetensors", checkpoint(8 * KiB))}).is_success


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_upload_over_the_scratch_bound_is_413_before_it_is_all_on_disk(
    served: tuple[FastAPI, str], scratch_parent: Path, declared: bool
) -> None:
    """Declared, it is refused on its Content-Length before the body is read; chunked, once the bytes written pass
    the bound (the first half of it is sent, and the server answers without waiting for the rest)."""
    app, url = served
    status, answer = PartialUpload(url, checkpoint(10 * 1024 * KiB), declared=declared).answer()
    assert status == 413
    assert b"max_upload_scratch_bytes" in answer
    assert sum(p.stat().st_size for p in scratch_files(scratch_parent)) == 0
    assert slots(app).scratch_bytes == 0
    assert slots(app).active == 0


def test_uploads_together_over_the_scratch_bound_get_503(tmp_path: Path, scratch_parent: Path) -> None:
    app = app_of(tmp_path, max_concurrent_uploads=2, max_upload_scratch_bytes=256 * KiB)
    with uvicorn_thread(app) as url:
        first = PartialUpload(url, checkpoint(160 * KiB))
        wait_until(lambda: slots(app).active == 1, "the first upload to start")
        second = httpx.post(f"{url}/checkpoints/inspect", files={"file": ("w.safetensors", checkpoint(160 * KiB))})
        assert second.status_code == 503, second.text
        assert "max_upload_scratch_bytes" in second.json()["detail"]
        assert "retry-after" in second.headers
        assert first.finish()[0] == 200
        assert slots(app).scratch_bytes == 0


def test_a_client_leaving_mid_upload_leaves_no_scratch(served: tuple[FastAPI, str], scratch_parent: Path) -> None:
    app, url = served
    upload = PartialUpload(url, checkpoint(3 * 1024 * KiB))  # its first half is past one write to disk
    wait_until(lambda: slots(app).active == 1, "the upload to start")
    wait_until(lambda: bool(scratch_files(scratch_parent)), "the upload's first bytes on disk")
    upload.abandon()
    wait_until(lambda: slots(app).active == 0, "the abandoned upload to end")
    assert scratch_files(scratch_parent) == []
    assert slots(app).scratch_bytes == 0
    assert httpx.post(f"{url}/checkpoints/inspect", files={"file": ("w.safetensors", checkpoint(8 * KiB))}).is_success
