"""What the benchmarks share: the stack of child processes (stack), figures and machine
readings (stats), report lines (report), the JSON-line link to child processes (link),
worker processes (workers), WebSocket client pools (clients), the open-loop REST load
(load) and counting wrappers around the bus and redis-py (counting), and flags (cli)."""

__all__ = ["cli", "clients", "counting", "link", "load", "report", "stack", "stats", "workers"]
