"""Benchmarks that print figures. Run each as a module from the repository root
(`python -m bench.runtime`): as scripts, bench/swarm.py would shadow the swarm package."""
