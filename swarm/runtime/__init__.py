"""The model runtime, in packages that depend one way (execution > text > checkpoint >
families > weights, kv_cache; see docs/architecture.md): finding and converting checkpoints,
loading layer spans, running them with per-session KV caches, embedding, head and sampling.
Synchronous torch; callers run it on the compute thread (`swarm.runtime.execution.compute`)."""
