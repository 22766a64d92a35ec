#!/usr/bin/env bash
# The project's test command (README.md); CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-nvrtc.sh   # NVRTC + CUDA headers from PyPI into .nvrtc/, for the kernel-compile test
./scripts/install-vulkan.sh  # a Vulkan loader + Mesa's lavapipe, for the Vulkan backend's tests
export LD_LIBRARY_PATH="$PWD/.nvrtc/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --workspace --release
cargo test --release -p evokernel --test kernels_compile -- --nocapture
./scripts/test-python.sh     # the PyTorch op: wheel built by maturin, pytest against torch on the CPU
