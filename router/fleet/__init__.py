"""The gateway fleet: records gateways announce, the cached copy hot paths read, drain
requests, and dispatch (placing a connecting client on a gateway)."""

# No re-exports: importing one module of the package loads only what it needs.
