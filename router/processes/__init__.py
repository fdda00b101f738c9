"""imroute's processes: starting, supervising and stopping them (not routing; the
command line and the push service's workers stand on it, routing never imports it):

- `supervisor`: the one child-process supervisor (the push service's workers, `imroute
  dev`, benchmarks, process tests);
- `devstack`: `imroute dev`, the whole stack as child processes;
- `embedded_redis`: a real redis-server when none answers;
- `ports`: free loopback ports;
- `procs`: children that die with their parent.
"""

# No re-exports: importing one module of the package loads only what it needs.
