"""Redis for the route store, the fleet, the jobs and the Streams bus: one client factory
and one mapping of redis-py's errors into ours."""

# No re-exports: importing one module of the package loads only what it needs.
