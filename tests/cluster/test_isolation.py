"""The single-process path never imports Ray: `pip install hookserve` without the extra keeps working."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.reliability.live_server import REPO_ROOT

CHECK = """
import sys
import service.main, service.__main__, service.cluster.config, service.cluster.plan, service.cluster.router
import service.cluster.front, service.cluster.local_ray, service.cluster.__main__
service.main.create_app()
loaded = sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))
assert not loaded, loaded
print("no ray")
"""


def test_service_main_and_the_ray_free_cluster_modules_do_not_import_ray() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-c", CHECK]
    done = subprocess.run(command, check=False, cwd=REPO_ROOT, env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout.strip() == b"no ray"
