"""OpenMP settings that only take effect in the environment before torch loads libgomp.

After a parallel region libgomp's idle workers busy-wait for more work, by default for
300,000 spins (milliseconds on this project's CPU) before they sleep. Inside a forward the
next region follows within microseconds, so a short spin loses nothing there; but after
the last one, the spinning worker holds a core that the event loop needs to send the answer
and, on a small machine, that the client needs to read it. With 10,000 spins a 10 MB
`/activations` answer came back ~1.8 ms sooner (22.4 -> 20.6 ms p50 on 2 cores, interleaved
runs) while `/predict` latency and throughput at 1, 8 and 32 clients stayed the same; at
2,000 spins a two-thread forward itself got slower. A value already in the environment wins.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

DEFAULTS = {"GOMP_SPINCOUNT": "10000"}


def apply(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set every default the environment does not already set (call before importing torch)."""
    for key, value in DEFAULTS.items():
        environ.setdefault(key, value)
