"""What a broadcast frame costs the gateway per connection, by how alike the frames are.

    .venv/bin/python -m bench.frame_cost [--conns 5000] [--rounds 30]

A push frame carries the connection's `pos`, which differs per connection wherever the
users have P2P history, so a batch's frame is completed per connection (the frames of
one batch are shared by position, at most 64). This measures, in one process and
without sockets (a sink that only counts), the gateway's fan-out of one broadcast batch
(`LocalConnections.deliver_all`) to `--conns` connections:

- every connection at its own P2P position (a frame built per connection);
- every connection at the same position (one frame; the position still worked out per
  connection);
- the floor: one pre-built frame written to every connection (`write_all`), what frames
  with identical bytes would cost at the least, before the bookkeeping of acks.

Best of `--rounds`, in µs per connection. The difference between the first and the
floor is all that identical bytes for every recipient could save.
"""

from __future__ import annotations

import argparse
import time

from shared.models import Message
from shared.positions import seq_of
from shared.wire import push_frame, push_prefix
from socket_gateway.connections import ClientConn, LocalConnections

EPOCH = 1_733_000_000_000


class CountingSink:
    __slots__ = ("writes",)

    def __init__(self) -> None:
        self.writes = 0

    def is_open(self) -> bool:
        return True

    def buffered(self) -> int:
        return 0

    def write(self, data: bytes) -> None:
        self.writes += 1

    def abort(self) -> None:
        return None

    def close(self, code: int, reason: str = "") -> None:
        return None


def connections(n: int, distinct: bool) -> LocalConnections:
    conns = LocalConnections()
    for i in range(n):
        conn = ClientConn(f"user{i:06d}", f"c{i}", CountingSink())
        conn.p = seq_of(EPOCH, i + 1 if distinct else 1)
        conns.add(conn)
    return conns


def best_us(n: int, rounds: int, distinct: bool | None) -> float:
    message = Message("m" * 32, "p" * 32, 1, "admin", b'{"text":"a broadcast to all"}', 1)
    conns = connections(n, bool(distinct))
    best = float("inf")
    for k in range(rounds):
        prefix = push_prefix(message)  # a new batch each round: no frame reused across
        started = time.perf_counter()
        if distinct is None:
            conns.write_all(push_frame(prefix, "2~0.0~1.0~0.0~~0.0"))
        else:
            conns.deliver_all(prefix, "b", seq_of(EPOCH, k + 1), "ref")
        best = min(best, time.perf_counter() - started)
        for conn in conns:
            conn.sent = None
    return best / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--conns", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    rows = (
        ("each connection at its own position", True),
        ("every connection at one position", False),
        ("one pre-built frame (the floor)", None),
    )
    print(f"one broadcast batch to {args.conns:,} connections, best of {args.rounds}:")
    for label, distinct in rows:
        print(f"  {label:<40} {best_us(args.conns, args.rounds, distinct):.2f} µs/connection")


if __name__ == "__main__":
    main()
