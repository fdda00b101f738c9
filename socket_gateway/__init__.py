"""Socket gateway: holds client WebSockets, writes pushes to them, serves Deliver over gRPC.

In the order a push travels through it:

- `grpc_server` (P2P: Deliver/DeliverMany from the router) and `bus_consumer`
  (broadcast and multicast batches from the bus) both hand batches to
- `delivery`, the delivery core (`DeliverService`: dedup by batch id, expiry, one
  encoded frame per batch), which writes to
- `connections`, the local uid -> connections map, whose sinks are the connections of
- `ws/`, the client WebSocket endpoint (protocol, framing, handshake, keepalive, conn,
  endpoint).

Beside them: `heartbeat` (fleet record, route refresh, drain), `pacing` (the refresh and
the keepalive round spread over their intervals), `dedup`, `metrics`,
`faults` (test-only gRPC interceptors), and `app`, which composes and starts/stops it all.
"""

# No re-exports: importing one module of the package loads only what it needs.
