#!/usr/bin/env bash
# Check the Triton kernels on CUDA and benchmark them against torch, in one
# command, in under 8 minutes on one H200. Installs nothing; prints one table.
#   benchmarks/gpu/run.sh [bench_gpu.py options]     (--help lists them)
# Exit status: 0 checks passed, 1 a check failed, 2 no CUDA, 124 cut short.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo_root"
python_bin="${PYTHON:-}"
if [[ -z "$python_bin" ]]; then
  if [[ -x .venv/bin/python ]]; then python_bin=.venv/bin/python; else python_bin=python3; fi
fi
export PYTHONPATH="$repo_root${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET  # compiled kernels only

# SIGINT at 470 s lets the script print the rows it has; 15 s later it is killed.
exec timeout --signal=INT --kill-after=15 470 "$python_bin" benchmarks/gpu/bench_gpu.py "$@"
