"""The client-facing WebSocket endpoint `GET /ws?token=<JWT>`, without a task per connection.

Measured against the `websockets` asyncio server it replaced (bench/ws_endpoints.py,
10k idle connections): about 3.5 KiB per idle connection instead of 15.5, with the same
or better fan-out. It is built for that small idle footprint:

- one `asyncio.Protocol` object (with `__slots__`) per connection, driving the sans-I/O
  `websockets.server.ServerProtocol`: the library parses and validates the handshake and
  the frames (masking, control frames, UTF-8 close reasons, the 4096-byte message limit,
  no extensions so no compression) and produces pongs and close echoes; the connection
  object writes them out after every receive;
- the handshake runs on a short-lived `ServerProtocol` that is dropped after the 101, and
  the frame phase on a fresh one created in the OPEN state, so the parsed request and
  its headers are not kept for the life of the connection;
- the connection object is also the connection's `Sink`: pushes are pre-built frame bytes
  written straight to the transport by `LocalConnections.deliver`;
- no task and no keepalive task per connection: ONE gateway-wide task pings every
  connection every `WsTimers.ping_interval_s` and closes (1011) those that sent nothing since the
  previous ping; handshake and closing deadlines are `loop.call_later` handles that live
  only while a connection is opening or closing; sockets without their 101 yet are
  capped, in all and per address (`HandshakeLimits`), and a refused one is closed once
  its answer is written;
- registering and unregistering the route are short-lived tasks at connect and
  disconnect (the registry's calls are coroutines); an unregister always runs after the
  register has finished, so a route is never written back after its removal.

Modules, in the order bytes travel:

- `protocol`: sans-I/O: close codes, limits, wire bytes, deadlines, what a text message means;
- `ratelimit`: sans-I/O: the per-connection frame rate (1008); counts of its closes and of
  per-user cap refusals;
- `admission`: sans-I/O: the limits before the 101, the per-IP connect rate, refusal
  counts (the sockets without a 101 are counted per address from their accept, the
  biggest holder's oldest making room, by `socket_gateway.preauth`);
- `conn`: `WsConn`, one connection from its first byte to its last: the HTTP upgrade
  and everything refused before the 101 (429, 503, 401), then the per-user cap (4429,
  after it) and the route (1013); its state and Sink, the frame phase, the gateway-wide
  ping round, the closing handshake; and `EndpointState`, what the connections share;
- `endpoint`: `WsEndpoint` (listening, shutdown) and `WsServer`.
"""

# No re-exports: importing one module of the package loads only what it needs.
