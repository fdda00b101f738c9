"""Leaf package: models, settings, wire formats, the Redis key schema, errors and the proto."""

# No re-exports: importing one module of the package loads only what it needs.
