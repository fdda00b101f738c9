"""Routing logic, one package per stage of the data path (see the README's architecture):

`p2p` (plan and pusher), `routes` (the Userinfo store), `gateway_rpc` (the gRPC client
stack), `fanout` (broadcast and multicast batches), `bus` (transports), `hedging`,
`balancing` (pure rules, stats, circuits), `fleet` (gateway records, dispatch, drains),
`directory` (SQL users), `jobs`, `redis` (client and error mapping), `devtools`, `cli`,
and `testing` (the shared test doubles).
"""

# No re-exports: importing one module of the package loads only what it needs.
