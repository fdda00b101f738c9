"""The fleet's live figures for the dashboard: counts each process samples every second
(pushes by mode, frames written, acks, queued, bus publishes and hedges, delivery
latency) summed in Redis per short interval, kept ten minutes (`store`), and read back
as per-second rates and percentiles (`series`, pure)."""
