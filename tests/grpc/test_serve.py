"""`python -m service` serves gRPC beside HTTP on HOOKSERVE_GRPC_PORT, and stops it on SIGTERM."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import tritonclient.grpc as tgrpc

from service.registry.builtin import ZOO_DIR
from tests.grpc.test_grpc import LENET
from tests.helpers.waiting import wait_until
from tests.reliability.live_server import LiveServer, free_port


def test_python_m_service_serves_grpc_beside_http(tmp_path: Path) -> None:
    shutil.copy(ZOO_DIR / "weights" / "lenet_digits.pt", tmp_path)
    shutil.copy(ZOO_DIR / "digits_labels.txt", tmp_path)
    port = free_port()
    with LiveServer(tmp_path, LENET, env={"HOOKSERVE_GRPC_PORT": str(port)}) as server:
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
        wait_until(client.is_server_ready, "gRPC not ready")
        x = tgrpc.InferInput("input__0", [1, 3, 32, 32], "FP32")
        x.set_data_from_numpy(np.zeros((1, 3, 32, 32), dtype=np.float32))
        assert client.infer("lenet", [x]).as_numpy("output__0").shape == (1, 10)
        client.close()
        assert server.stop() == 0
