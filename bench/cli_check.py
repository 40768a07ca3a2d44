"""How long `hookserve check` and a refused start-up take, beside what importing torch alone costs on the same
machine in the same run: `python -m bench.cli_check [--repeats N]`.

    hookserve check (built-in registry)   the five built-in models rehearsed on the meta device
    python -m service --config none.toml  a missing config: answered before the server is imported
    python -c "import torch"              the floor under anything that builds a model

Each is a fresh process (what a person or a CI step runs); the median of `--repeats` runs is printed
with the others' medians, so a busy machine shows as a slower torch import, not as a slower check.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def seconds(command: list[str], cwd: Path, expect: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != expect:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}, not {expect}: {done.stderr[-500:]}")
    return elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cli_check", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each command (the median is printed)")
    args = parser.parse_args(argv)
    python = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        commands = {
            "hookserve check (built-in registry)": ([python, "-m", "service.cli", "check", "--port", "0"], None),
            "python -m service --config none.toml": ([python, "-m", "service", "--config", "none.toml"], 2),
            'python -c "import torch"': ([python, "-c", "import torch"], 0),
        }
        medians = {}
        for name, (command, expect) in commands.items():
            if expect is None:  # check binds its port: a free one each run
                runs = [
                    seconds([*command[:-1], str(free_port())], cwd, 0) for _ in range(args.repeats)
                ]  # fmt: skip
            else:
                runs = [seconds(command, cwd, expect) for _ in range(args.repeats)]
            medians[name] = statistics.median(runs)
    width = max(map(len, medians))
    for name, median in medians.items():
        print(f"{name:<{width}}  {median:6.2f} s (median of {args.repeats})")


if __name__ == "__main__":
    main()
