"""clients/js/imroute.js's reconnect decisions under Node (no browser, no network: its
WebSocket and fetch are injected): a connection that never opens is reported to
dispatch as `?avoid=<gateway>`, and the client goes where dispatch then sends it.
The browser tier (tests/browser) runs the same module against real processes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

MODULE = Path(__file__).resolve().parents[2] / "clients/js/imroute.js"

SCRIPT = """
const { ImrouteClient } = await import(process.argv[1]);
const asked = [];
const opened = [];
// gw1 never opens (a browser sees 1006); gw2 opens and says the client is caught up.
class FakeSocket {
  constructor(url) {
    opened.push(url);
    this.readyState = 0;
    setTimeout(() => {
      if (url.startsWith("ws://gw1")) return this.onclose({ code: 1006, reason: "" });
      this.readyState = 1;
      this.onopen();
      this.onmessage({ data: JSON.stringify({ type: "recovered", complete: true, count: 0 }) });
    }, 1);
  }
  send() {}
  close() { this.readyState = 3; }
}
const fetchImpl = async (url) => {
  asked.push(url);
  const avoid = new URL(url).searchParams.get("avoid");
  const gw = avoid === "gw1" ? "gw2" : "gw1";  // gw1 is the emptiest, unless avoided
  return new Response(JSON.stringify({ ws_url: `ws://${gw}/ws`, gateway_id: gw,
                                       group_id: "g1" }), { status: 200 });
};
// Sent back to gw1 for ever (the fault this checks for): report what it did, and stop.
setTimeout(() => {
  console.log(JSON.stringify({ asked: asked.slice(0, 4), opened: opened.slice(0, 4) }));
  process.exit(0);
}, 5000).unref();
const c = new ImrouteClient({ apiUrl: "http://api/", token: "t", WebSocketImpl: FakeSocket,
                              fetchImpl, backoffMinMs: 1 });
await c.connect();
const gateway = c.gateway.gateway_id;
c.close();
console.log(JSON.stringify({ asked, opened, gateway, stats: c.stats }));
"""


def test_a_connection_that_never_opened_asks_dispatch_to_avoid_its_gateway() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to run clients/js/imroute.js")
    out = subprocess.run(
        [node, "--input-type=module", "-e", SCRIPT, MODULE.as_uri()],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["asked"] == ["http://api/v1/dispatch", "http://api/v1/dispatch?avoid=gw1"]
    assert result["opened"] == ["ws://gw1/ws", "ws://gw2/ws"]
    assert result["gateway"] == "gw2"
    assert result["stats"]["avoided"] == 1 and result["stats"]["connects"] == 1
