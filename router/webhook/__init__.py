"""Webhooks for offline fallback: events to the app's own server.

`base` is the seam (`Event`, `EventSink`); `outbox` the fleet's bounded Redis Stream
producers emit into; `sender` the task in every push service that delivers it, signed
as `signing` says; `presence` and `sweeper` produce user.offline and user.online.
"""

# No re-exports: importing one module of the package loads only what it needs.
