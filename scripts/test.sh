#!/usr/bin/env bash
# The project's test command (README.md); CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --workspace --release
