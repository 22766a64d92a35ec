#!/usr/bin/env bash
# Installs NVRTC 13.0 and the CUDA 13.0 runtime headers from PyPI into .nvrtc/ of this
# checkout (not the system), so kernels compile on machines with no CUDA toolkit (CI).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.nvrtc
if [ -f "$dest/nvidia/cu13/include/cuda_bf16.h" ] && ls "$dest"/nvidia/cu13/lib/libnvrtc.so.13 >/dev/null 2>&1; then
  exit 0
fi
python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dest" \
  nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96
ls "$dest/nvidia/cu13/lib/libnvrtc.so.13" "$dest/nvidia/cu13/include/cuda_bf16.h" >/dev/null
