"""Weights travel between peers: a node without the model file learns the model's index (its
manifest, config and tokenizer) from a peer and fetches the parts it is planned to serve, in
chunks checked against the part's digest, from every peer that holds them."""
