"""The model runtime: finding and converting checkpoints, loading layer spans, running them
with per-session KV caches, embedding, head and sampling. Synchronous torch; callers run it on
the compute thread (`swarm.runtime.compute`)."""
