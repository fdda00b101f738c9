"""The P2P path: a pure plan (recipients grouped by gateway, answers merged) and the
pusher that looks routes up and makes one Deliver call per gateway."""

# No re-exports: importing one module of the package loads only what it needs.
