"""`python -m service` puts libgomp's settings in the environment before torch loads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from service import openmp_env

PROBE = """
import json, os, sys
import service.__main__  # what `python -m service` runs, without starting the server
import service.main  # what it imports (with torch) once the settings have passed their checks
order = list(sys.modules)  # insertion order = import order
print(json.dumps({
    "spincount": os.environ.get("GOMP_SPINCOUNT"),
    "set_before_torch": order.index("service.openmp_env") < order.index("torch"),
}))
"""


def probe(env_value: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if env_value is not None:
        env["GOMP_SPINCOUNT"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(("given", "expected"), [(None, "10000"), ("300000", "300000")])
def test_spincount_is_set_before_torch_loads_unless_given(given: str | None, expected: str) -> None:
    assert probe(given) == {"spincount": expected, "set_before_torch": True}


def test_apply_only_fills_gaps() -> None:
    env = {"OTHER": "1"}
    openmp_env.apply(env)
    assert env == {"OTHER": "1", "GOMP_SPINCOUNT": "10000"}
    env = {"GOMP_SPINCOUNT": "5"}
    openmp_env.apply(env)
    assert env == {"GOMP_SPINCOUNT": "5"}
