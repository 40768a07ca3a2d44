"""Data-set jobs from the clients: start, wait, read the result, cancel and delete, as the HTTP API answers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import service.client as hs
from service.client import AsyncClient, Client, calls
from service.client.features import read_features
from tests.client.servers import TOKEN
from tests.reliability.live_server import LiveServer


def test_a_job_from_start_to_result(live: LiveServer) -> None:
    with Client(live.base_url, token=TOKEN) as client:
        started = client.start_job("exemplars", "lenet", "digits", ["fc3"], limit=40, parameters={"k": 2})
        assert started["state"] in ("queued", "running")
        ended = client.wait_for_job(started["id"], timeout=120, poll=0.05)
        assert ended["state"] == "succeeded"
        result = client.job_result(started["id"])
        assert [len(unit) for unit in result["layers"]["fc3"]] == [2] * 10
        assert started["id"] in [job["id"] for job in client.jobs()]
        assert client.cancel_job(started["id"])["state"] == "succeeded"  # a finished job is deleted
        with pytest.raises(hs.NotFound):
            client.job(started["id"])


def test_a_features_job_downloads_into_a_folder_read_features_reads(live: LiveServer, tmp_path: Path) -> None:
    with Client(live.base_url, token=TOKEN) as client:
        started = client.start_job("features", "lenet", "digits", ["fc3"], limit=30, parameters={"shard_size": 16})
        assert client.wait_for_job(started["id"], timeout=120, poll=0.05)["state"] == "succeeded"
        folder = client.download_job(started["id"], tmp_path / "sync")
    names, x = read_features(folder)
    assert names == [f"digits/{i}" for i in range(30)]
    assert x.shape == (30, 10)

    async def go() -> Path:
        async with AsyncClient(live.base_url, token=TOKEN) as client:
            return await client.download_job(started["id"], tmp_path / "async")

    again = asyncio.run(go())
    assert sorted(p.name for p in again.iterdir()) == sorted(p.name for p in folder.iterdir())
    assert all((again / p.name).read_bytes() == p.read_bytes() for p in folder.iterdir())


def test_a_download_that_does_not_match_the_record_is_refused() -> None:
    result = {"shards": [{"file": "features-00000.safetensors", "bytes": 3, "sha256": "0" * 64}]}
    with pytest.raises(ValueError, match="do not match"):
        calls.check_job_file("features-00000.safetensors", b"abc", result)
    assert calls.check_job_file("index.json", b"{}", result) == b"{}"


def test_the_async_client_cancels_a_job(live: LiveServer) -> None:
    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        async with AsyncClient(live.base_url, token=TOKEN) as client:
            started = await client.start_job("unit_stats", "lenet", "digits", ["conv1"])
            cancelled = await client.cancel_job(started["id"])
            return cancelled, await client.wait_for_job(started["id"], timeout=30)

    cancelled, ended = asyncio.run(go())
    assert cancelled["state"] == ended["state"] == "cancelled", (cancelled, ended)


def test_jobs_need_the_token(live: LiveServer) -> None:
    with Client(live.base_url) as anonymous, pytest.raises(hs.Unauthorized):
        anonymous.jobs()
