"""Each replica's own `/metrics` copied into Ray's metrics export, one gauge per series.

Ray exports every process's metrics per node (prefixed `ray_`), adds the replica's
`deployment`, `replica` and `application` labels, and lists the nodes for Prometheus. So
`hookserve_requests_total` of one replica is scraped as
`ray_hookserve_requests_total{deployment="group-digits",replica="…",…}`. Counters and
histogram buckets become gauges holding the same numbers: `rate()` and
`histogram_quantile()` read them as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("hookserve.cluster")


class GaugeLike(Protocol):
    def set(self, value: float, tags: dict[str, str] | None = None) -> None: ...


GaugeFactory = Callable[[str, str, tuple[str, ...]], GaugeLike]


def ray_gauge(name: str, description: str, tag_keys: tuple[str, ...]) -> GaugeLike:
    """A Ray Serve gauge (it adds the replica's own labels)."""
    from ray.serve.metrics import Gauge

    gauge: GaugeLike = Gauge(name, description=description or name, tag_keys=tag_keys)
    return gauge


class MetricsMirror:
    """Turns Prometheus text into gauge updates; a series whose label names change is skipped."""

    def __init__(self, factory: GaugeFactory = ray_gauge) -> None:
        self.factory = factory
        self.gauges: dict[str, tuple[GaugeLike, tuple[str, ...]]] = {}
        self._warned: set[str] = set()

    def update(self, text: str) -> int:
        """Set a gauge for every sample (creation timestamps left out); the number of samples set."""
        count = 0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                keys = tuple(sorted(sample.labels))
                known = self.gauges.get(sample.name)
                if known is None:
                    known = (self.factory(sample.name, family.documentation, keys), keys)
                    self.gauges[sample.name] = known
                gauge, expected = known
                if keys != expected:
                    if sample.name not in self._warned:
                        self._warned.add(sample.name)
                        log.warning("metric %s changed its labels %s -> %s; not mirrored", sample.name, expected, keys)
                    continue
                gauge.set(float(sample.value), tags=dict(sample.labels))
                count += 1
        return count
