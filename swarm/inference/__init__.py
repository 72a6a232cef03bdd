"""Running requests: the entry side (tokenize, embed, send steps, sample, stream) and the
pipelines that carry hidden states through every layer."""
