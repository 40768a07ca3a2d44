"""The client and the remote commands talk HTTP only: importing them loads nothing of the server, nor torch."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.reliability.live_server import REPO_ROOT

SERVER_SIDE = ("torch", "torchvision", "fastapi", "starlette", "uvicorn", "captum", "timm", "pydantic")


def modules_after(imports: str) -> list[str]:
    code = f"import sys, json\n{imports}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def test_the_client_and_the_commands_import_no_server_code() -> None:
    loaded = modules_after("import service.client, service.client.features, service.cli.main")
    ours = {m for m in loaded if m.startswith("service.")}
    assert all(m.startswith(("service.client", "service.cli")) for m in ours), sorted(ours)
    assert not [m for m in loaded if m.split(".")[0] in SERVER_SIDE]


def test_check_shares_the_servers_validation_and_builds_on_meta_without_the_server() -> None:
    loaded = modules_after("from service.cli.main import run\nrun(['check', '--port', '0'])")
    assert "service.config_check" in loaded
    assert "service.specs.model" in loaded
    assert "service.registry.dry_build" in loaded  # torch, to build each model on the meta device
    assert not [m for m in loaded if m.split(".")[0] in ("fastapi", "starlette", "uvicorn")]
