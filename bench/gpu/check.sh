#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py): compiled Triton kernels against the reference
# dequantizer for every block type, packed layers against float16 ones, nvml readings.
# Runs from a fresh checkout with the torch and Triton the machine has, within 8 minutes.
#   bash bench/gpu/check.sh [--layers 4] [--prefill 512] [--types Q4_K,Q6_K]
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1  # what a stopped run printed still shows
"$PY" - <<'PYEOF'
import importlib.util
missing = [m for m in ("torch", "triton", "numpy", "psutil", "gguf", "pynvml")
           if importlib.util.find_spec(m) is None]
if missing:
    print("missing modules (the checks that need them will say so):", ", ".join(missing))
PYEOF
timeout 470 "$PY" -m bench.gpu_check "$@"
rc=$?
[ "$rc" = 124 ] && echo "bench.gpu_check ran past 470 s and was stopped"
exit "$rc"
