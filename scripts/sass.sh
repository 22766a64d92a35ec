#!/usr/bin/env bash
# Resource usage (registers, shared, stack, spills) and SASS of one specialization,
# without a GPU: NVRTC compiles it, cuobjdump (from PyPI) reads the CUBIN.
# Usage: scripts/sass.sh CASE VARIANT[:k=v,..] [--sass] [EPILOGUE, e.g. bias+silu+res]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/.nvrtc/tools"
if [ ! -x "$tools/nvidia/cu13/bin/cuobjdump" ]; then
  mkdir -p "$tools"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tools/wheels" \
    nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
  (cd "$tools" && for w in wheels/*.whl; do python3 -m zipfile -e "$w" .; done)
  chmod +x "$tools"/nvidia/cu13/bin/*
fi
export PATH="$tools/nvidia/cu13/bin:$PATH"
"$root/scripts/install-nvrtc.sh" >/dev/null
export LD_LIBRARY_PATH="$root/.nvrtc/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
out=$(mktemp --suffix=.cubin)
cargo run -q --release --example cubin -- "$1" "$2" "$out" ${4:-}
"$tools/nvidia/cu13/bin/cuobjdump" -res-usage "$out" | grep -E "Function|REG"
if [ "${3:-}" = "--sass" ]; then "$tools/nvidia/cu13/bin/cuobjdump" -sass "$out"; fi
rm -f "$out"
