"""How long a GGUF file's tokenizer takes to load: swarm's (the fields read from the file when
the model is indexed, then the tokenizer built from the cache's copy at each start) beside
transformers' GGUF conversion of the same file, and llama.cpp's own load where llama_cpp
imports. Each is timed in a fresh process, best of `--rounds`.

    python -m bench.tokenizer_load /work/.cache/tokenizer-gguf/qwen2.gguf

By default the largest vocab GGUF that bench.tokenizer_golden wrote."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from bench.tokenizer_golden import GGUFS

_STEPS = {
    "swarm: GGUF fields read (indexing, once)": (
        "from swarm.runtime.checkpoint.gguf_metadata import read_tokenizer_fields as r\n"
        "t = time.perf_counter(); r(path); took = time.perf_counter() - t"
    ),
    "swarm: tokenizer from the cache (each start)": (
        "from swarm.runtime.checkpoint.gguf_metadata import read_tokenizer_fields, write_fields\n"
        "from swarm.runtime.text.tokenizer import load_tokenizer\n"
        "import tempfile; folder = Path(tempfile.mkdtemp())\n"
        "write_fields(folder, read_tokenizer_fields(path))\n"
        "t = time.perf_counter(); load_tokenizer(folder).encode('warm'); "
        "took = time.perf_counter() - t"
    ),
    "transformers: AutoTokenizer(gguf_file=...)": (
        "from transformers import AutoTokenizer\n"
        "t = time.perf_counter()\n"
        "AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)\n"
        "took = time.perf_counter() - t"
    ),
    "llama.cpp: Llama(vocab_only=True)": (
        "import llama_cpp\n"
        "t = time.perf_counter(); llama_cpp.Llama(str(path), vocab_only=True, verbose=False)\n"
        "took = time.perf_counter() - t"
    ),
}


def _time(step: str, path: Path) -> float | None:
    code = (
        f"import time, warnings; from pathlib import Path; warnings.simplefilter('ignore')\n"
        f"path = Path({str(path)!r})\n{step}\nprint(took)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"  failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description="GGUF tokenizer load times")
    parser.add_argument("gguf", nargs="?", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    path = args.gguf or max(
        (p for p in GGUFS.glob("*.gguf") if "-pre-" not in p.name),
        key=lambda p: p.stat().st_size,
    )
    from swarm.runtime.checkpoint.gguf_metadata import read_tokenizer_fields

    fields = read_tokenizer_fields(path)
    print(
        f"{path.name}: {len(fields['tokenizer.ggml.tokens'])} tokens, "
        f"{len(fields.get('tokenizer.ggml.merges') or [])} merges, "
        f"model {fields['tokenizer.ggml.model']}, pre {fields.get('tokenizer.ggml.pre')}"
    )
    started = time.monotonic()
    for name, step in _STEPS.items():
        times = [t for _ in range(args.rounds) if (t := _time(step, path)) is not None]
        shown = f"{min(times):7.2f} s (best of {len(times)})" if times else "    n/a"
        print(f"  {name:48s} {shown}")
    print(f"({time.monotonic() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
