"""Delivery receipts: per push, what became of each recipient (`base` says what)."""

# No re-exports: importing one module of the package loads only what it needs.
