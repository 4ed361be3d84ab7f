#!/usr/bin/env bash
# The GPU check and benchmark, in one command, in under 5 minutes on one H200; prints two tables.
#   1. offline install of the serving stack from .gpu-wheels/ (benchmarks/gpu/prepare_offline.sh, run where
#      the registries are; the GPU machine has torch, triton, transformers and timm but no network)
#   2. the Triton kernels against their torch references, and their timings   (bench_gpu.py, <= 1 min)
#   3. a random SigLIP at google/siglip-large-patch16-256's shape: bf16/fp16 accuracy, raw forward vs
#      mmserve eager vs CUDA graphs, nvJPEG vs Pillow decode, and `mmserve serve --model` at saturation
#      (KServe v2 binary uint8 batches through wrk, no decode; the fp32 server also answers a batch of
#      JPEGs decoded by its own --decode-device cuda intake)                   (real_model.py, <= 3.75 min)
#   4. several devices: one engine per GPU against one engine, served images/s (engines.py; only where more than
#      one GPU is visible, <= 4 min; on a one-GPU box it prints that it was skipped and takes seconds)
# Served runs that would not fit the budget print a "skipped: time budget" row (bf16 eager served, usually);
# `python3 benchmarks/gpu/real_model.py --budget-s 400` alone gives every row.
#   benchmarks/gpu/run.sh [--kernels-only | --model-only | --engines-only]
# Exit status: 0 checks passed, 1 a check failed, 2 no CUDA, 124 cut short.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo_root"
python_bin="${PYTHON:-}"
if [[ -z "$python_bin" ]]; then
  if [[ -x .venv/bin/python ]]; then python_bin=.venv/bin/python; else python_bin=python3; fi
fi
wheels="${MMSERVE_GPU_WHEELS:-$repo_root/.gpu-wheels}"
site=/tmp/mmserve-site
export PYTHONPATH="$repo_root${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET  # compiled kernels only
export PYTHONUNBUFFERED=1

if [[ -d "$wheels" ]]; then
  if compgen -G "$wheels/*.whl" >/dev/null; then
    if "$python_bin" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$wheels"/*.whl; then
      export PYTHONPATH="$PYTHONPATH:$site"
    else
      echo "offline install from $wheels failed (wheels are for CPython 3.12): the served rows will fail" >&2
    fi
  fi
  if compgen -G "$wheels/wrk_*.deb" >/dev/null && ! command -v wrk >/dev/null; then
    mkdir -p /tmp/mmserve-wrk
    for deb in "$wheels"/*.deb; do dpkg -x "$deb" /tmp/mmserve-wrk; done
    export WRK=/tmp/mmserve-wrk/usr/bin/wrk
    export LD_LIBRARY_PATH="/tmp/mmserve-wrk/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
else
  echo "no $wheels: the served rows need fastapi, uvicorn, pydantic, ... (benchmarks/gpu/prepare_offline.sh)" >&2
fi

status=0
if [[ "${1:-}" == "--engines-only" ]]; then
  timeout --signal=INT --kill-after=10 270 "$python_bin" benchmarks/gpu/engines.py --budget-s 250 || status=$?
  exit "$status"
fi
if [[ "${1:-}" != "--model-only" ]]; then
  # SIGINT lets a section print the rows it has; 15 s later it is killed.
  timeout --signal=INT --kill-after=10 60 "$python_bin" benchmarks/gpu/bench_gpu.py --skip-vit --skip-compile \
    --batch-sizes 8 64 --budget-s 45 || status=$?
fi
if [[ "${1:-}" != "--kernels-only" ]]; then
  model_status=0
  timeout --signal=INT --kill-after=10 225 "$python_bin" benchmarks/gpu/real_model.py --budget-s 205 \
    || model_status=$?
  if [[ $status -eq 0 ]]; then status=$model_status; fi
fi
if [[ -z "${1:-}" ]]; then
  engines_status=0
  timeout --signal=INT --kill-after=10 270 "$python_bin" benchmarks/gpu/engines.py --budget-s 250 || engines_status=$?
  if [[ $status -eq 0 ]]; then status=$engines_status; fi
fi
exit "$status"
