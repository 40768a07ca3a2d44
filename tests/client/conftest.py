"""One live server for the client tests (see `servers.py`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.client.servers import serve_lenet
from tests.reliability.live_server import LiveServer


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serve_lenet(tmp_path_factory.mktemp("client-models")) as server:
        yield server
