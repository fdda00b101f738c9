"""Push service: the FastAPI shell that callers use to push to users."""

# No re-exports: importing one module of the package loads only what it needs.
