"""Weights as the runtime holds them: GGUF's quantized blocks decoded (`ggml`), packed tensors
and the products over them (`packed`, `quant`), the compiled CPU kernels (`native`, the C in
`kernels/`) and the C heap's housekeeping (`heap`). Knows nothing of files, families or
requests: a checkpoint reader hands it blocks, a family asks it for products."""
