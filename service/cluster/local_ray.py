"""The local Ray cluster that `python -m service.cluster` starts: loopback only, its token beside its files.

Set before Ray is imported (Ray reads these at import, and its processes inherit them):

- `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, Ray's single-machine mode: its node address is
  127.0.0.1, not the machine's own, so the GCS, raylet, dashboard, agents and workers listen
  on loopback (`ray.init(_node_ip_address="127.0.0.1")` says the same). One kind of port
  cannot follow: each Serve replica's inter-deployment gRPC server, which Ray Serve 2.60
  binds to `[::]:0` with no setting; token authentication guards it (below).
- Token authentication (Ray 2.60's default for a new cluster) stays on, but with its token in
  a file beside Ray's session files (`<temp dir>/hookserve-auth-token`, mode 0600) named by
  `RAY_AUTH_TOKEN_PATH`, where Ray would otherwise write `~/.ray/auth_token` unasked. A
  `RAY_AUTH_MODE`, `RAY_AUTH_TOKEN` or `RAY_AUTH_TOKEN_PATH` already set is kept.
- `RAY_USAGE_STATS_ENABLED=0` unless set: Ray sends nothing out.

`ray.init` also gets `worker_niceness = 0`: Ray starts its workers (the replicas) at nice 15
otherwise, below any other process on the machine.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_TEMP_DIR = Path("/tmp/ray")  # Ray's own default
# The front's handles route on its own event loop, not on a second thread's (one thread hop less per request)
FRONT_ENV = {"RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}
TOKEN_FILE = "hookserve-auth-token"
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class LocalRay:
    """What the command set up for its own Ray cluster."""

    temp_dir: Path
    auth: str  # "token" or "disabled"
    token_path: Path | None  # the token this command wrote; None when auth is off or the token is the caller's


def _write_token(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older file keeps its mode otherwise
        os.write(fd, secrets.token_hex(32).encode())
    finally:
        os.close(fd)


def prepare(temp_dir: Path | None, environ: MutableMapping[str, str]) -> LocalRay:
    """Set in `environ` what the local cluster needs (before ray is imported); writes a new token if Ray needs one."""
    root = (temp_dir or DEFAULT_TEMP_DIR).resolve()
    environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    auth = environ.setdefault("RAY_AUTH_MODE", "token").lower()
    token_path = None
    if auth == "token" and not environ.get("RAY_AUTH_TOKEN") and not environ.get("RAY_AUTH_TOKEN_PATH"):
        token_path = root / TOKEN_FILE
        _write_token(token_path)
        environ["RAY_AUTH_TOKEN_PATH"] = str(token_path)
    return LocalRay(root, auth, token_path)


def init_kwargs(local: LocalRay, args: Mapping[str, Any]) -> dict[str, Any]:
    """`ray.init` arguments for the local cluster (`args`: the command's `ray_cpus`, `ray_gpus`)."""
    kwargs: dict[str, Any] = {
        "_node_ip_address": LOOPBACK,
        "_temp_dir": str(local.temp_dir),
        "_system_config": {"worker_niceness": 0},
        "dashboard_host": LOOPBACK,
    }
    for arg, key in (("ray_cpus", "num_cpus"), ("ray_gpus", "num_gpus")):
        if args.get(arg) is not None:
            kwargs[key] = args[arg]
    return kwargs


def cli_hint(local: LocalRay | None, gcs_address: str, dashboard_url: str | None) -> str:
    """How to point Ray's own CLI at this cluster."""
    env = []
    if local is not None and local.auth == "token":
        env.append("RAY_AUTH_MODE=token")
        if local.token_path is not None:
            env.append(f"RAY_AUTH_TOKEN_PATH={local.token_path}")
    prefix = " ".join(env) + (" " if env else "")
    hint = f"{prefix}ray status --address {gcs_address}"
    if dashboard_url:
        hint += f"; {prefix}serve status -a {dashboard_url}"
    return hint
