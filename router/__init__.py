"""Routing logic, one package per stage of the data path (see docs/architecture/code-map.md):

`p2p` (plan and pusher), `routes` (the Userinfo store), `gateway_rpc` (the client stack to
the gateways: the delivery link, else gRPC DeliverMany), `fanout` (broadcast and multicast
batches), `bus` (transports), `hedging`, `balancing` (pure rules, stats, circuits),
`fleet` (gateway records, dispatch, drains), `directory` (SQL users), `jobs`, `recovery`
(the logs a client resumes from), `receipts`, `webhook`, `stats`, `redis` (client, error
mapping, the Lua runner), and `testing` (the shared test doubles).

Not routing, and above it (routing never imports them; an import contract says so):
`cli`, the `imroute` command, one module per subcommand; `processes`, starting and
supervising imroute's processes (the push service's workers, `imroute dev`).
"""

# No re-exports: importing one module of the package loads only what it needs.
