"""File answers (safetensors, npz, npy) are sent part by part, in pieces, with their exact length."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import torch
from starlette.types import Message

from service.api import responses
from service.api.responses import PartsResponse
from service.config import Settings
from service.main import create_app
from tests.conftest import read_binary_answer, wait_settled
from tests.helpers.serving import ResponseMessages, uvicorn_thread

LENET = (
    '[[models]]\nname = "tiny"\nsource = "python"\narchitecture = "service.zoo.lenet:LeNet"\ninput_size = [3, 32, 32]\n'
)


def test_a_safetensors_answer_arrives_in_pieces_with_its_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a real server: the body goes out in pieces of at most PIECE_BYTES (the last message empty and
    final), `Content-Length` is the file's size, no chunked encoding, and the file reads back as the captures
    the npz answer holds."""
    monkeypatch.setattr(responses, "PIECE_BYTES", 4096)
    (tmp_path / "models.toml").write_text(LENET)
    app = create_app(Settings(model_dir=tmp_path, config=tmp_path / "models.toml", worker_threads=1))
    recorder = ResponseMessages(app)
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    inputs = [{"tensor": {"shape": [3, 32, 32], "dtype": "float32", "data": t.tolist()}} for t in x]
    body = {"model": "tiny", "inputs": inputs, "layers": ["conv1", "conv2"], "capture": "both"}
    with uvicorn_thread(recorder) as url, httpx.Client(base_url=url, timeout=60, trust_env=False) as client:
        wait_settled(client)
        recorder.bodies.clear()
        answer = client.post("/activations", json={**body, "format": "safetensors"})
        pieces = list(recorder.bodies)
        as_npz = client.post("/activations", json={**body, "format": "npz"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-length"] == str(len(answer.content))
    assert "transfer-encoding" not in answer.headers
    assert pieces[-1] == (0, False)
    assert all(more for _, more in pieces[:-1])
    assert all(0 < size <= 4096 for size, _ in pieces[:-1])
    assert sum(size for size, _ in pieces) == len(answer.content)
    assert len(pieces) > len(answer.content) // 4096  # conv1's input alone is 2 x 3 x 32 x 32 x 4 bytes
    tensors, rest = read_binary_answer(answer.content, "safetensors")
    want, want_rest = read_binary_answer(as_npz.content, "npz")
    assert sorted(tensors) == sorted(want)
    for key, t in want.items():
        assert torch.equal(tensors[key], t)
    assert rest == want_rest


def _sent(response: PartsResponse) -> list[Message]:
    messages: list[Message] = []

    async def send(message: Message) -> None:
        messages.append(message)

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    asyncio.run(response({"type": "http", "method": "POST"}, receive, send))
    return messages


def test_parts_are_cut_into_pieces_that_cover_them_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty parts send nothing, a part of exactly two pieces sends two, and the bytes come out in order."""
    monkeypatch.setattr(responses, "PIECE_BYTES", 4)
    floats = torch.arange(3, dtype=torch.float32)  # 12 bytes as a memoryview of 3 floats
    parts: list[bytes | memoryview] = [b"abcde", b"", floats.numpy().data, b"12345678"]
    messages = _sent(PartsResponse(parts, "application/octet-stream", {"X-Test": "1"}))
    start, *bodies = messages
    assert start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-length"] == b"25"
    assert headers[b"content-type"] == b"application/octet-stream"
    assert headers[b"x-test"] == b"1"
    sizes = [len(m["body"]) for m in bodies]
    assert sizes == [4, 1, 4, 4, 4, 4, 4, 0]
    assert b"".join(bytes(m["body"]) for m in bodies) == b"abcde" + floats.numpy().tobytes() + b"12345678"
    assert [m["more_body"] for m in bodies] == [True] * 7 + [False]
