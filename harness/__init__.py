"""What benchmarks and tests share: each family's tiny seeded model (as an HF folder and as
GGUF, `family_models`, `factories`), seeded GGUF fixtures and their block writers, network
namespaces and CPU quotas as slower or separate machines, timed streams from a node's API, the
stand-ins tests talk to, the docs' examples run as written (`doc_examples`), the one wait
(`polling.until`) and the one member-record factory (`factories.member`), and where
slow-to-make files are kept. Both import it; neither imports
the other, and no test module imports another: what two need is here. Node processes come
from `swarm.demo`, the launcher `swarm demo` itself runs, so tests start nodes as users do."""
