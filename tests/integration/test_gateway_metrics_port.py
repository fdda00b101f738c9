"""`/metrics` is on the gateway's internal port, not on the public WebSocket port. Real
gateway, real sockets."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.integration.stack import client, gateway

pytestmark = pytest.mark.integration


async def test_metrics_are_served_on_the_internal_port_only(redis_url: str, prefix: str) -> None:
    async with (
        gateway(redis_url, prefix, "gw1", "g1", metrics_port=0) as gw,
        client(gw, "alice"),
        httpx.AsyncClient() as http,
    ):
        assert gw.metrics_port and gw.metrics_port != gw.ws_port
        public = await http.get(f"http://127.0.0.1:{gw.ws_port}/metrics")
        assert public.status_code == 404 and public.json()["error"] == "not_found"
        assert "imroute_gateway" not in public.text

        scrape = await http.get(f"http://127.0.0.1:{gw.metrics_port}/metrics")
        assert scrape.status_code == 200
        assert scrape.headers["content-type"].startswith("text/plain")
        assert "imroute_gateway_connections 1.0" in scrape.text
        other = await http.get(f"http://127.0.0.1:{gw.metrics_port}/ws")
        assert other.status_code == 404 and other.json()["error"] == "not_found"

        # A head that never ends is cut; the port keeps answering.
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.metrics_port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        assert await asyncio.wait_for(reader.read(), 8) == b""
        writer.close()
        assert (await http.get(f"http://127.0.0.1:{gw.metrics_port}/metrics")).status_code == 200


async def test_no_metrics_port_unless_one_is_set(redis_url: str, prefix: str) -> None:
    async with gateway(redis_url, prefix, "gw1", "g1") as gw, httpx.AsyncClient() as http:
        assert gw.metrics_port is None
        assert (await http.get(f"http://127.0.0.1:{gw.ws_port}/metrics")).status_code == 404
