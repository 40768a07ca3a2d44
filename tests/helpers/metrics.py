"""Reading `GET /metrics` in tests: every sample by name and label set."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: TestClient) -> Samples:
    """Every sample of the Prometheus text answer."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample with exactly these labels; 0 when absent (a counter or histogram not yet observed)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def queue_depth(client: TestClient, model: str) -> float:
    """`hookserve_queue_depth` of `model`, scraped now."""
    return value(scrape(client), "hookserve_queue_depth", model=model)
