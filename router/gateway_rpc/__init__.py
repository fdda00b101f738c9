"""The router's gRPC client of the gateways, in one module, `client`, as a stack of
layers, top to bottom:

1. `client.CoalescingGatewayClient`: pushes to one gateway that queue behind the calls
   in flight leave together in one DeliverMany (each keeps its reply and deadline).
2. `client.ResilientGatewayClient`: per-gateway call stats, the circuit breaker, and
   retries of a whole RPC on the same gateway (same batch ids, so never twice).
3. `client.GrpcGatewayClients`: one carrier per call, the gateway's delivery link
   (`link`, opened here in the background) when it is open, else a unary DeliverMany on
   the one grpc.aio channel per gateway address; errors become GatewayUnavailable here.

The resilient layer counts every RPC it makes (`client.CallMetrics`, Prometheus series)
and logs the failed ones. `P2PPusher` calls the top of the stack; each layer takes the
one below. The layers meet at the seams of `base`; the delivery link (`link`) is a
module of its own, as a transport is.
"""

# No re-exports: importing one module of the package loads only what it needs.
