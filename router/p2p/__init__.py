"""The P2P path: a pure plan (recipients grouped by gateway, answers merged) and the
pusher that logs, looks routes up and calls each gateway once for all its batches."""

# No re-exports: importing one module of the package loads only what it needs.
