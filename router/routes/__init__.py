"""The Userinfo store: where each live connection of a user is, in Redis.

- `codec`: a route's value, written by the gateway and read by every look-up.
- `registry`: register, refresh and remove routes; look them up for P2P and multicast.
- `reads`: many route hashes in one round trip.
- `writer`: coalesces a gateway's concurrent route writes into pipelines.
"""

# No re-exports: importing one module of the package loads only what it needs.
