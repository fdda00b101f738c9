"""push_service.worker.merge_scrapes: several workers' scrapes as one, labelled."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from push_service.worker import merge_scrapes


def _scrape(pushes: int, gateway: str) -> bytes:
    registry = CollectorRegistry()
    Counter("imroute_x_pushes", "pushes", ["gateway_id"], registry=registry).labels(gateway).inc(
        pushes
    )
    Histogram("imroute_x_seconds", "latency", registry=registry).observe(0.01 * pushes)
    return generate_latest(registry)


def test_each_family_once_each_sample_labelled_with_its_worker() -> None:
    merged = merge_scrapes({"0": _scrape(3, "gw1"), "1": _scrape(5, "gw2")}).decode()
    assert merged.count("# TYPE imroute_x_pushes_total counter") == 1
    assert merged.count("# TYPE imroute_x_seconds histogram") == 1
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    totals = {
        (s.labels["worker"], s.labels["gateway_id"]): s.value
        for s in families["imroute_x_pushes"].samples
        if s.name == "imroute_x_pushes_total"
    }
    assert totals == {("0", "gw1"): 3.0, ("1", "gw2"): 5.0}
    counts = {
        s.labels["worker"]: s.value
        for s in families["imroute_x_seconds"].samples
        if s.name == "imroute_x_seconds_count"
    }
    assert counts == {"0": 1.0, "1": 1.0}


def test_one_scrape_is_labelled_too() -> None:
    merged = merge_scrapes({"0": _scrape(1, "gw1")}).decode()
    assert 'imroute_x_pushes_total{gateway_id="gw1",worker="0"} 1.0' in merged
