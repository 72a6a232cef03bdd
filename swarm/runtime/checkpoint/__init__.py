"""Reading checkpoints: finding a model (`source`), reading GGUF headers (`gguf_file`),
converting a GGUF file or an HF folder into the per-part cache (`convert`, `layout`,
`manifest`), naming its content (`content_key`) and loading parts from it (`store`). Knows
nothing of execution: it hands out tensors and the model's config."""
