"""The compiled parts, each optional and built where the compiler and the CPU allow:

* swarm's CPU kernels for packed weights and a layer's small steps
  (swarm/runtime/weights/kernels/); without them, nodes run torch's int4 and int8 kernels
  (swarm.runtime.weights.native says which a node uses);
* a decode step's frame sealed and opened in one call each (swarm/wire/frames/); without it,
  frames go through the Python path of swarm/wire/frame.py, byte for byte the same.

Everything else is in pyproject.toml."""

import platform
import sys

from setuptools import Extension, setup

extensions = []
if platform.machine().lower() in ("x86_64", "amd64") and sys.platform != "win32":
    extensions.append(
        Extension(
            "swarm.runtime.weights._kernels",
            sources=[
                "swarm/runtime/weights/kernels/module.c",
                "swarm/runtime/weights/kernels/products.c",
                "swarm/runtime/weights/kernels/products_wide.c",
                "swarm/runtime/weights/kernels/blocks.c",
                "swarm/runtime/weights/kernels/blocks_wide.c",
                "swarm/runtime/weights/kernels/layer_ops.c",
                "swarm/runtime/weights/kernels/attention.c",
                "swarm/runtime/weights/kernels/experts.c",
                "swarm/runtime/weights/kernels/dense_layer.c",
            ],
            depends=[
                "swarm/runtime/weights/kernels/kernels.h",
                "swarm/runtime/weights/kernels/products.h",
                "swarm/runtime/weights/kernels/blocks.h",
                "swarm/runtime/weights/kernels/block_decode.h",
                "swarm/runtime/weights/kernels/block_kinds.h",
                "swarm/runtime/weights/kernels/block_steps.h",
                "swarm/runtime/weights/kernels/kquant_rows.h",
                "swarm/runtime/weights/kernels/kquant_rows_wide.h",
                "swarm/runtime/weights/kernels/grid_codes.h",
                "swarm/runtime/weights/kernels/byte_rows.h",
                "swarm/runtime/weights/kernels/byte_rows_wide.h",
                "swarm/runtime/weights/kernels/wide_sums.h",
            ],
            # AVX2, FMA and F16C only in these files; swarm.runtime.weights.native loads
            # it only on a CPU that has them. products_wide.c also uses AVX-512, only where the CPU
            # says so.
            extra_compile_args=["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"],
            extra_link_args=["-fopenmp"],
            optional=True,
        )
    )

if sys.platform != "win32":
    extensions.append(
        Extension(
            "swarm.wire._frames",
            sources=["swarm/wire/frames/module.c", "swarm/wire/frames/sha256.c"],
            depends=["swarm/wire/frames/sha256.h"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    )

setup(ext_modules=extensions)
