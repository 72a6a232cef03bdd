"""GPU products on packed GGUF blocks: Triton kernels that read the blocks as stored.

`blocks` decodes one weight of each block type (ggml's layouts), `products` holds the two
kernels (a fused dequantize-and-multiply for 1..8 activation rows, tiles dequantized into
`tl.dot` for more), `matrix` is the `Matrix` they make of a packed tensor on a CUDA device,
and `device` is the CUDA-only glue (memory, streams, graphs, readings) behind one Protocol.
Triton is imported only when a kernel first runs, so the package costs nothing without it.
It knows nothing of the weights package above it: a matrix gets its block layout and value
tables from its caller."""
