"""Redis for the route store, the fleet, the jobs and the Streams bus: one client factory,
one mapping of redis-py's errors into ours, and one way to run Lua (`scripts`)."""

# No re-exports: importing one module of the package loads only what it needs.
