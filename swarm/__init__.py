"""swarm: distributed large-language-model inference for home labs."""

__version__ = "0.1.0"
