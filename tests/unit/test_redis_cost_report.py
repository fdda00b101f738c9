"""bench.redis_cost's pure part: commandstats diffs, key families, memory deltas and the
MONITOR reading."""

from __future__ import annotations

import json

from bench.redis_cost_report import (
    CONTENT_BYTES,
    content_of,
    key_family,
    memory_delta,
    message_bytes,
    monitor_sources,
    net_calls,
    script_calls,
)


def test_the_content_is_exactly_50_bytes_of_compact_json() -> None:
    for seq in (0, 7, 999, 100_999):
        assert len(json.dumps(content_of(seq), separators=(",", ":"))) == CONTENT_BYTES == 50


def test_net_calls_subtract_the_idle_run_and_drop_zeros() -> None:
    busy = {"evalsha": 40, "hgetall": 10, "set": 3, "info": 3}
    idle = {"set": 3, "info": 3, "xreadgroup": 1}
    assert net_calls(busy, idle) == {"evalsha": 40, "hgetall": 10, "xreadgroup": -1}
    assert list(net_calls({"a": 1, "b": 5}, {})) == ["b", "a"]  # largest first


def test_script_calls_count_every_way_of_running_one() -> None:
    assert script_calls({"evalsha": 3, "eval": 1, "fcall": 2, "hset": 7}) == 6


def test_key_families() -> None:
    p = "bench:ab12:"
    assert key_family(p + "rcpt:{abc}", p) == "rcpt"
    assert key_family(p + "ulog:{u0}", p) == "ulog"
    assert key_family(p + "{stats}:1733", p) == "{stats}"
    assert key_family(p + "gateways", p) == "gateways"


def test_memory_delta_counts_growth_new_keys_and_gone_keys_by_family() -> None:
    p = "x:"
    before = {"x:ulog:{u0}": 1000, "x:rcpt:{a}": 300, "x:gw:gw1": 200}
    after = {"x:ulog:{u0}": 1500, "x:rcpt:{b}": 296, "x:rcpt:{c}": 296, "x:gw:gw1": 200}
    delta = memory_delta(before, after, p)
    assert delta == {"rcpt": {"bytes": 292, "keys": 1}, "ulog": {"bytes": 500, "keys": 0}}
    assert message_bytes(delta | {"{stats}": {"bytes": 90, "keys": 1}}) == 792


def test_monitor_lines_split_into_clients_scripts_and_round_trips() -> None:
    lines = [
        "OK",
        '+1.000000 [0 127.0.0.1:1] "HGETALL" "route:u0"',
        '+1.000010 [0 127.0.0.1:1] "EVALSHA" "abc" "3"',  # pipelined with the HGETALL
        '+1.000050 [0 lua] "HINCRBY" "useq" "n" "1"',
        '+1.000060 [0 lua] "RPUSH" "ulog" "x"',
        '+1.000800 [0 127.0.0.1:1] "EVALSHA" "def" "2"',  # after a reply: a new trip
        '+1.000810 [0 lua] "HSET" "rcpt" "m" "p2p"',
        '+1.000820 [0 127.0.0.1:2] "EVALSHA" "fc1" "2"',  # another client
    ]
    got = monitor_sources(lines)
    assert got["client"] == {"hgetall": 1, "evalsha": 3}
    assert got["script"] == {"hincrby": 1, "rpush": 1, "hset": 1}
    assert got["round_trips"] == 3
