"""A replica's /metrics text becomes one gauge per series for Ray's export, labels kept."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from service.cluster.metrics_mirror import MetricsMirror


class FakeGauge:
    def __init__(self, name: str, description: str, keys: tuple[str, ...]) -> None:
        self.name, self.description, self.keys = name, description, keys
        self.values: dict[tuple[tuple[str, str], ...], float] = {}

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        assert tags is not None
        assert tuple(sorted(tags)) == self.keys
        self.values[tuple(sorted(tags.items()))] = value


def test_counters_gauges_and_histograms_are_copied() -> None:
    registry = CollectorRegistry()
    requests = Counter("hookserve_requests", "Requests.", ["route", "status"], registry=registry)
    depth = Gauge("hookserve_queue_depth", "Queue.", ["model"], registry=registry)
    latency = Histogram(
        "hookserve_request_duration_seconds", "Latency.", ["route"], buckets=(0.1, 1.0), registry=registry
    )
    requests.labels("/predict", "200").inc(3)
    depth.labels("lenet").set(2)
    latency.labels("/predict").observe(0.5)
    gauges: dict[str, FakeGauge] = {}

    def factory(name: str, description: str, keys: tuple[str, ...]) -> FakeGauge:
        gauges[name] = FakeGauge(name, description, keys)
        return gauges[name]

    mirror = MetricsMirror(factory)
    count = mirror.update(generate_latest(registry).decode())
    assert "hookserve_requests_created" not in gauges
    assert gauges["hookserve_requests_total"].values == {(("route", "/predict"), ("status", "200")): 3.0}
    assert gauges["hookserve_requests_total"].description == "Requests."
    assert gauges["hookserve_queue_depth"].values == {(("model", "lenet"),): 2.0}
    buckets = gauges["hookserve_request_duration_seconds_bucket"].values
    assert buckets[(("le", "0.1"), ("route", "/predict"))] == 0.0
    assert buckets[(("le", "1.0"), ("route", "/predict"))] == 1.0
    assert gauges["hookserve_request_duration_seconds_count"].values == {(("route", "/predict"),): 1.0}
    assert count == 1 + 1 + 3 + 2
    requests.labels("/predict", "200").inc()
    mirror.update(generate_latest(registry).decode())
    assert gauges["hookserve_requests_total"].values[(("route", "/predict"), ("status", "200"))] == 4.0


def test_a_series_whose_labels_change_is_skipped_not_fatal() -> None:
    gauges: dict[str, FakeGauge] = {}

    def factory(name: str, description: str, keys: tuple[str, ...]) -> FakeGauge:
        gauges[name] = FakeGauge(name, description, keys)
        return gauges[name]

    mirror = MetricsMirror(factory)
    mirror.update('# TYPE x gauge\nx{a="1"} 1\n')
    assert mirror.update('# TYPE x gauge\nx{b="2"} 2\n') == 0
    assert gauges["x"].values == {(("a", "1"),): 1.0}
