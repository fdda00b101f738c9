"""The Userinfo store: where each live connection of a user is, in Redis.

- `registry`: register, refresh and remove routes; look them up for P2P and multicast;
  a route's value (written by the gateway, read by every look-up) and the reads of many
  route hashes in one round trip.
- `writer`: coalesces a gateway's concurrent route writes into pipelines.
"""

# No re-exports: importing one module of the package loads only what it needs.
