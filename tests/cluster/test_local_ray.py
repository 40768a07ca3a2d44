"""What `python -m service.cluster` sets before it starts its own Ray: loopback, its token beside Ray's files.

`tests/cluster/test_replicated.py` runs the command on its own Ray and checks what it made (the
listening addresses, nothing under HOME, the replicas' niceness).
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from service.cluster import local_ray


def test_a_new_cluster_keeps_to_loopback_and_its_token_out_of_home(tmp_path: Path) -> None:
    environ: dict[str, str] = {}
    local = local_ray.prepare(tmp_path / "ray", environ)
    assert environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert environ["RAY_USAGE_STATS_ENABLED"] == "0"
    assert environ["RAY_AUTH_MODE"] == "token"
    token = Path(environ["RAY_AUTH_TOKEN_PATH"])
    assert token == local.token_path == tmp_path / "ray" / local_ray.TOKEN_FILE
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert len(token.read_text()) == 64
    kwargs = local_ray.init_kwargs(local, {"ray_cpus": 2})
    assert kwargs["_node_ip_address"] == kwargs["dashboard_host"] == "127.0.0.1"
    assert kwargs["_system_config"] == {"worker_niceness": 0}
    assert kwargs["num_cpus"] == 2
    assert "num_gpus" not in kwargs
    hint = local_ray.cli_hint(local, "127.0.0.1:6379", "http://127.0.0.1:8265")
    assert f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token} ray status --address 127.0.0.1:6379" in hint
    assert "serve status -a http://127.0.0.1:8265" in hint


@pytest.mark.parametrize(
    "given", [{"RAY_AUTH_MODE": "disabled"}, {"RAY_AUTH_TOKEN": "mine"}, {"RAY_AUTH_TOKEN_PATH": "/somewhere"}]
)
def test_the_callers_auth_choice_is_kept(tmp_path: Path, given: dict[str, str]) -> None:
    environ = dict(given)
    local = local_ray.prepare(tmp_path, environ)
    assert local.token_path is None
    assert not (tmp_path / local_ray.TOKEN_FILE).exists()
    assert {k: environ[k] for k in given} == given
    if "RAY_AUTH_MODE" in given:
        assert "RAY_AUTH_MODE=token" not in local_ray.cli_hint(local, "h:1", None)
