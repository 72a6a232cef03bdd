"""llama.cpp's own command-line tools (rpc-server, llama-bench, llama-batched-bench,
llama-simple), built once from the source that llama-cpp-python's sdist vendors into a cache,
for the benchmarks that put swarm beside llama.cpp's RPC mode and its batched decoding, and for
the embedded model's greedy answers beside swarm's (bench.beside_llama_cpp). A
bench dependency only: CI never builds it.

A native build, except on CPUs that show AMX: there the CPU's kernel families are named one by
one and AMX left out, since its kernels fault on VMs whose CPU flags show AMX but whose kernel
does not enable it (some of this project's machines; `cmake_flags`). The build folder is named
after the flags, so a cache moved to another CPU builds again. RPC is on, which is what
`ggml-rpc-server` and `--rpc` need.

    python -m bench.llama_cpp_tools [--sdist llama_cpp_python-0.3.36.tar.gz] [--jobs 2]

prints where the tools are; the first build takes ~15-25 minutes on two cores. The sdist is
fetched with pip when not given (`pip download --no-deps --no-binary :all:
llama-cpp-python==0.3.36`). The cache is `$SWARM_LLAMA_CPP_CACHE`, or `.cache/llama.cpp`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.paths import REPO

VERSION = "0.3.36"  # llama-cpp-python's, as pinned by the [llamacpp] extra
CACHE = Path(os.environ.get("SWARM_LLAMA_CPP_CACHE", REPO / ".cache" / "llama.cpp"))
TARGETS = ("ggml-rpc-server", "llama-bench", "llama-batched-bench", "llama-simple")
_COMMON_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_RPC=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
)
# CPU flag (as /proc/cpuinfo names it) -> the ggml option that turns its kernels on
_KERNEL_OPTIONS = (
    ("avx", "GGML_AVX"),
    ("avx2", "GGML_AVX2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
    ("avx512f", "GGML_AVX512"),
    ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "GGML_AVX512_BF16"),
)


@dataclass(frozen=True)
class Tools:
    rpc_server: Path
    bench: Path
    batched_bench: Path
    simple: Path  # greedy text from a prompt


def built(cache: Path = CACHE) -> Tools | None:
    """The tools if a build finished in `cache`, else None."""
    bin_dir = build_dir(cache) / "bin"
    tools = Tools(*(bin_dir / name for name in TARGETS))
    if all(p.is_file() for p in (tools.rpc_server, tools.bench, tools.batched_bench, tools.simple)):
        return tools
    return None


def build(sdist: Path | None, jobs: int, cache: Path = CACHE) -> Tools:
    """Build the tools once (a finished build is reused)."""
    done = built(cache)
    if done is not None:
        return done
    source = cache / f"src-{VERSION}"
    if not (source / "CMakeLists.txt").is_file():
        _unpack(sdist or _download(cache), source)
    out = build_dir(cache)
    flags = cmake_flags(_cpu_flags())
    subprocess.run(["cmake", "-S", str(source), "-B", str(out), *flags], check=True)
    command = ["cmake", "--build", str(out), "-j", str(jobs), "--target", *TARGETS]
    subprocess.run(command, check=True)
    tools = built(cache)
    if tools is None:
        raise SystemExit(f"the build in {out} did not produce {', '.join(TARGETS)}")
    return tools


def build_dir(cache: Path) -> Path:
    """Where this CPU's build goes: one folder per set of options."""
    digest = hashlib.sha256(" ".join(cmake_flags(_cpu_flags())).encode()).hexdigest()[:8]
    return cache / f"build-{VERSION}-{digest}"


def cmake_flags(cpu: frozenset[str]) -> list[str]:
    """The build's options for a CPU with these flags: a native build, except where the CPU
    shows AMX, whose native kernels fault on VMs that show the flag without the kernel's
    support; there each kernel family the CPU has is named instead."""
    if not any(flag.startswith("amx") for flag in cpu):
        return [*_COMMON_FLAGS, "-DGGML_NATIVE=ON"]
    named = [f"-D{option}={'ON' if flag in cpu else 'OFF'}" for flag, option in _KERNEL_OPTIONS]
    return [*_COMMON_FLAGS, "-DGGML_NATIVE=OFF", *named]


def _cpu_flags() -> frozenset[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def _download(cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"llama-cpp-python=={VERSION}",
            "-d",
            str(cache),
        ],
        check=True,
    )
    return cache / f"llama_cpp_python-{VERSION}.tar.gz"


def _unpack(sdist: Path, source: Path) -> None:
    """The sdist's vendor/llama.cpp, as `source`."""
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    source.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=source.parent) as tmp:
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
            archive.extractall(tmp, members=members, filter="data")
        Path(tmp, prefix).rename(source)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path, default=None)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    tools = build(args.sdist, args.jobs)
    for path in (tools.rpc_server, tools.bench, tools.batched_bench, tools.simple):
        print(path)


if __name__ == "__main__":
    main()
