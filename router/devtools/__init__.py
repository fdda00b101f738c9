"""Running imroute on one machine, rather than in a deployment:

- `devstack`: `imroute dev`, the whole stack as child processes;
- `supervisor`: the one child-process supervisor (dev, benchmarks, process tests);
- `ports`: free loopback ports;
- `embedded_redis`: a real redis-server when none answers;
- `procs`: children that die with their parent.
"""

# No re-exports: importing one module of the package loads only what it needs.
