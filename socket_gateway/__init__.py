"""Socket gateway: holds client WebSockets, writes pushes to them, serves the delivery calls.

In the order a push travels through it:

- `link_server` and `grpc_server` (P2P: the router's calls on the delivery link, else
  gRPC DeliverMany) and `bus_consumer` (broadcast and multicast batches from the bus)
  all hand batches to
- `delivery`, the delivery core (`DeliverService`: dedup by batch id in its memories of
  recent batches, expiry, one encoded frame per batch), which writes to
- `connections`, the local uid -> connections map, whose sinks are the connections of
- `ws/`, the client WebSocket endpoint (protocol, admission, ratelimit, conn, endpoint).

Beside them: `heartbeat` (fleet record, route refresh, drain), `pacing` (the refresh and
the keepalive round spread over their intervals), `metrics`, `faults` (test-only gRPC
interceptors), and `app`, which composes and starts/stops it all.
"""

# No re-exports: importing one module of the package loads only what it needs.
