"""clients/js/imroute.js's reconnect decisions and faults, under Node (no browser, no
network: its WebSocket and fetch are injected, time is real but short): a connection
that never opens is reported to dispatch as `?avoid=<gateway>`, a connection gone
silent is found by its pings, backoff grows across connections that fail soon after
`recovered`, only a drain moves at once, a push frame without `pos` keeps the position,
and a WebSocket the browser refuses to build is said and retried. The browser tier
(tests/browser) runs the module against real processes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

MODULE = Path(__file__).resolve().parents[2] / "clients/js/imroute.js"

# `behave(url, socket, n)` decides what each fake gateway does; the script prints what
# the client did (`report()`), when `done()` says so or after 5 s.
HARNESS = """
const { ImrouteClient } = await import(process.argv[1]);
const opened = [];
const sent = [];
const errors = [];
const delays = [];
class FakeSocket {
  constructor(url, protocols) {
    if (globalThis.REFUSE && opened.length < globalThis.REFUSE) {
      opened.push("refused");
      throw new SyntaxError("bad subprotocol");
    }
    opened.push(url);
    this.readyState = 0;
    this.n = opened.length;
    setTimeout(() => behave(url, this, this.n), 1);
  }
  open() { this.readyState = 1; this.onopen(); }
  frame(f) { if (this.onmessage) this.onmessage({ data: JSON.stringify(f) }); }
  end(code) { this.readyState = 3; if (this.onclose) this.onclose({ code, reason: "" }); }
  send(data) { sent.push([this.n, JSON.parse(data)]); }
  close() { this.readyState = 3; }
}
const fetchImpl = async () => new Response(
  JSON.stringify({ ws_url: "ws://gw1/ws", gateway_id: "gw1", group_id: "g1" }), { status: 200 });
const c = new ImrouteClient({ apiUrl: "http://api", token: "t", WebSocketImpl: FakeSocket,
  fetchImpl, backoffMinMs: 10, backoffMaxMs: 2000, ...OPTIONS,
  onError: (e) => errors.push(String(e)),
  onState: (state, d) => { if (state === "reconnecting") delays.push(d.delayMs); } });
const report = () => {
  console.log(JSON.stringify({ opened, sent, errors, delays, pos: c.pos ?? null, stats: c.stats }));
  process.exit(0);
};
setTimeout(report, 5000).unref();
c.connect().catch(() => {});
const timer = setInterval(() => { if (done()) { clearInterval(timer); c.close(); report(); } }, 5);
"""


def node(script: str) -> dict[str, Any]:
    """What `script` (an ES module given the client module's URL as its argv[1]) prints
    last, as JSON."""
    found = shutil.which("node")
    if found is None:
        pytest.skip("no node to run clients/js/imroute.js")
    out = subprocess.run(
        [found, "--input-type=module", "-e", script, MODULE.as_uri()],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run(behave: str, done: str, options: str = "{}", before: str = "") -> dict[str, Any]:
    """HARNESS with fake gateways doing `behave` (JS, per socket), until `done` (a JS
    expression) holds."""
    return node(
        before
        + f"\nconst OPTIONS = {options};\n"
        + f"function behave(url, s, n) {{ {behave} }}\n"
        + f"function done() {{ return {done}; }}\n"
        + HARNESS
    )


def test_a_connection_gone_silent_is_found_by_its_pings_and_left() -> None:
    """The first gateway opens, says `recovered`, then nothing ever comes (nor a close):
    the client pings, hears nothing for an interval, and connects again."""
    got = run(
        behave='s.open(); s.frame({type: "recovered", complete: true, count: 0});'
        "if (n > 1) s.send = (d) => { sent.push([n, JSON.parse(d)]);"
        ' setTimeout(() => s.frame({type: "pong"}), 1); };',
        done="opened.length >= 2 && sent.some(([n]) => n === 2)",
        options="{ pingIntervalMs: 50 }",
    )
    assert len(got["opened"]) == 2 and got["stats"]["silent"] == 1, got
    assert [1, {"type": "ping"}] in got["sent"]  # pinged, never answered
    assert [2, {"type": "ping"}] in got["sent"]  # the second connection pings too


def test_a_connection_that_answers_its_pings_is_kept() -> None:
    got = run(
        behave='s.open(); s.frame({type: "recovered", complete: true, count: 0});'
        "s.send = (d) => { sent.push([n, JSON.parse(d)]);"
        ' setTimeout(() => s.frame({type: "pong"}), 1); };',
        done="sent.length >= 5",
        options="{ pingIntervalMs: 20 }",
    )
    assert got["opened"] == ["ws://gw1/ws"] and got["stats"]["silent"] == 0, got


def test_backoff_grows_across_connections_that_fail_soon_after_recovered() -> None:
    """A gateway that says `recovered` and then closes 1011 at once: the delays between
    attempts grow (a connection must live `stableMs` to start the backoff over)."""
    got = run(
        behave='s.open(); s.frame({type: "recovered", complete: true, count: 0});'
        "setTimeout(() => s.end(1011), 1);",
        done="delays.length >= 6",
    )
    delays = got["delays"][:6]
    # The nth wait is 10 ms * 2^(n-2) * [0.5, 1.5) (the first two one step each): the
    # sixth at least 80 ms. Reset at each `recovered`, every wait would be 5-15 ms.
    assert delays[5] >= 80 and delays[1] <= 15, delays


@pytest.mark.parametrize(("code", "at_once"), [(4503, True), (4429, False), (1011, False)])
def test_only_a_drain_moves_at_once(code: int, at_once: bool) -> None:
    """A drain (4503) asks dispatch at once; a 4429 that does not name the per-user cap
    is no move (no gateway sends one: a full gateway refuses before the 101) and waits a
    backoff step, as any other close."""
    got = run(
        behave=f"s.open(); if (n === 1) setTimeout(() => s.end({code}), 1);",
        done="delays.length >= 1",
    )
    first = got["delays"][0]
    assert (first == 0) is at_once and (at_once or first >= 5), got["delays"]


def test_a_push_without_pos_keeps_the_last_position() -> None:
    got = run(
        behave='s.open(); s.frame({type: "recovered", complete: true, count: 0});'
        's.frame({type: "push", msg_id: "m1", pos: "1~0~0~g1~0~1", content: 1});'
        's.frame({type: "push", msg_id: "m2", content: 2});',
        done="c.stats.pushes >= 2",
    )
    assert got["pos"] == "1~0~0~g1~0~1", got


def test_a_websocket_the_browser_refuses_to_build_is_said_and_tried_again() -> None:
    got = run(
        behave='s.open(); s.frame({type: "recovered", complete: true, count: 0});',
        done="c.stats.connects >= 1",
        before="globalThis.REFUSE = 2;",
    )
    assert got["opened"] == ["refused", "refused", "ws://gw1/ws"], got
    assert got["errors"] == ["SyntaxError: bad subprotocol"] * 2


# gw1 never opens (a browser sees 1006); dispatch then names gw2.
AVOID = """
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
    result = node(AVOID)
    assert result["asked"] == ["http://api/v1/dispatch", "http://api/v1/dispatch?avoid=gw1"]
    assert result["opened"] == ["ws://gw1/ws", "ws://gw2/ws"]
    assert result["gateway"] == "gw2"
    assert result["stats"]["avoided"] == 1 and result["stats"]["connects"] == 1


# Dispatch fails twice (no answer, then a 503), then answers; later a close() comes
# while a dispatch is in flight (a fetch that never settles).
DISPATCH_FAILS = """
const { ImrouteClient } = await import(process.argv[1]);
const states = [];
const errors = [];
let asks = 0;
let hang = false;
const fetchImpl = async () => {
  asks += 1;
  if (hang) return new Promise(() => {});
  if (asks === 1) throw new TypeError("Failed to fetch");
  if (asks === 2) return new Response("{}", { status: 503 });
  return new Response(JSON.stringify({ ws_url: "ws://gw1/ws", gateway_id: "gw1",
                                       group_id: "g1" }), { status: 200 });
};
class Silent { constructor() { this.readyState = 0; } close() {} send() {} }
const c = new ImrouteClient({
  apiUrl: "http://api", token: "t", fetchImpl, WebSocketImpl: Silent, backoffMinMs: 1,
  backoffMaxMs: 5, onError: (e) => errors.push(String(e)),
  onState: (s, d) => {
    states.push([s, d && d.error ? String(d.error) : null]);
    if (s === "reconnecting") throw new Error("the app's onState failed");
  },
});
const connecting = c.connect().then(() => "connected", (e) => `rejected: ${e.message}`);
while (asks < 3) await new Promise((r) => setTimeout(r, 1));
const late = new ImrouteClient({ apiUrl: "http://api", token: "t", backoffMinMs: 1,
  fetchImpl: async () => { hang = true; return new Promise(() => {}); },
  onError: (e) => errors.push(`late: ${e}`), onState: (s) => states.push([`late ${s}`, null]) });
const lateConnect = late.connect().then(() => "connected", (e) => `rejected: ${e.message}`);
await new Promise((r) => setTimeout(r, 5));
late.close();
c.close();
console.log(JSON.stringify({ states, errors, stats: c.stats, connecting: await connecting,
                             lateConnect: await lateConnect, lateStats: late.stats }));
"""


def test_each_failed_dispatch_is_told_and_a_close_meanwhile_ends_it_quietly() -> None:
    """A dispatch with no answer (a page whose origin the push service does not list gets
    the same TypeError) retried in silence before; a throwing onState now goes to
    onError; a close() while dispatch is asked neither reports nor errs."""
    got = node(DISPATCH_FAILS)
    assert got["states"][:2] == [
        ["reconnecting", "TypeError: Failed to fetch"],
        ["reconnecting", "Error: dispatch answered 503"],
    ], got
    assert got["stats"]["dispatchErrors"] == 2 and got["stats"]["dispatches"] == 3, got
    assert got["errors"].count("Error: the app's onState failed") == 2, got
    assert not any(e.startswith("late") for e in got["errors"]), got
    assert ["late closed", None] in got["states"], got
    assert not any(
        s in (["late reconnecting", None], ["late stopped", None]) for s in got["states"]
    )
    assert got["lateConnect"] == "rejected: closed before it connected", got
    assert got["lateStats"]["dispatchErrors"] == 0, got
    assert got["connecting"] == "rejected: closed before it connected", got
