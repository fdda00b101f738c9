"""push_service.worker.merge_scrapes: several workers' scrapes as one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from push_service.worker import merge_scrapes


def _scrape(pushes: int, gateway: str, tokens: float) -> bytes:
    registry = CollectorRegistry()
    Counter("imroute_x_pushes", "pushes", ["gateway_id"], registry=registry).labels(gateway).inc(
        pushes
    )
    Counter("imroute_x_all", "all", registry=registry).inc(pushes)
    Histogram("imroute_x_seconds", "latency", registry=registry).observe(0.01 * pushes)
    Gauge("imroute_x_tokens", "tokens", registry=registry).set(tokens)
    Counter("imroute_x_shared", "refused, fleet-wide", registry=registry).inc(4)
    return generate_latest(registry)


def test_counts_are_summed_and_gauges_take_the_highest() -> None:
    merged = merge_scrapes({"0": _scrape(3, "gw1", 7), "1": _scrape(5, "gw2", 9)}).decode()
    for kind, name in [("counter", "imroute_x_pushes_total"), ("histogram", "imroute_x_seconds")]:
        assert merged.count(f"# TYPE {name} {kind}") == 1
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    totals = {
        s.labels["gateway_id"]: s.value
        for s in families["imroute_x_pushes"].samples
        if s.name == "imroute_x_pushes_total"
    }
    assert totals == {"gw1": 3.0, "gw2": 5.0}
    # The same series from both workers is one series, their sum, with no worker label.
    assert "imroute_x_all_total 8.0" in merged
    counts = [s.value for s in families["imroute_x_seconds"].samples if s.name.endswith("_count")]
    assert counts == [2.0]
    assert [s.value for s in families["imroute_x_tokens"].samples] == [9.0]
    # Read from shared state by each worker: once, not twice.
    assert "imroute_x_shared_total 4.0" in merged
    assert "worker=" not in merged


def test_one_scrape_keeps_its_series() -> None:
    merged = merge_scrapes({"0": _scrape(1, "gw1", 2)}).decode()
    assert 'imroute_x_pushes_total{gateway_id="gw1"} 1.0' in merged
    assert "imroute_x_tokens 2.0" in merged
