#!/usr/bin/env bash
# Prepare, on a machine with the package registries, what benchmarks/gpu/run.sh installs offline on a GPU
# machine that has torch, triton, transformers, timm, torchvision, numpy, pillow, httpx and uvloop but
# none of mmserve's serving stack: wheels for CPython 3.12 on manylinux x86_64 and the wrk .deb, in
# .gpu-wheels/ (ignored by git; the device call carries it).
#   benchmarks/gpu/prepare_offline.sh [DIR]        (default .gpu-wheels)
# Versions are pinned to what this checkout's tests ran with; one version of each, no dependencies
# resolved (the GPU image's own torch stack must not be replaced).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:-$repo_root/.gpu-wheels}"
mkdir -p "$out"
python_bin="${PYTHON:-python3}"

wheels=(
  fastapi==0.165.0 starlette==1.10.0 annotated-doc==0.0.7 opentelemetry-api==1.45.2
  uvicorn==0.55.0 httptools==0.9.0
  pydantic==2.14.4 pydantic-core==2.50.5 pydantic-settings==2.16.3 python-dotenv==1.2.4
  annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
  orjson==3.13.0 fastdigest==0.12.0 python-multipart==0.0.34
)
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
           manylinux2014_x86_64 manylinux1_x86_64 musllinux_1_2_x86_64; do
  platforms+=(--platform "$tag")
done
for wheel in "${wheels[@]}"; do
  "$python_bin" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none "${platforms[@]}" -d "$out" "$wheel"
done

# wrk (the saturation load generator) and the LuaJIT it links, unpacked with dpkg -x on the GPU machine.
if command -v apt-get >/dev/null; then
  (cd "$out" && apt-get download wrk libluajit-5.1-2 libluajit-5.1-common 2>/dev/null) \
    || echo "apt-get download wrk failed: run.sh will skip the served part without wrk" >&2
fi
du -sh "$out"
ls "$out"
