#!/usr/bin/env bash
# The Python package's tests (part of ./scripts/test.sh): a venv with PyPI's torch (it runs
# on the CPU where there is no GPU), the abi3 wheel built by maturin, then pytest against
# torch's own ops. The venv is kept in .venv-py between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-py
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "torch==2.15.0" "pytest>=7" "maturin>=1.7,<2" numpy
# One target folder with the main workspace: the evokernel crate is built once.
export CARGO_TARGET_DIR="$PWD/target"
(cd python && cargo fmt -- --check && cargo clippy --release --all-targets -- -D warnings)
rm -rf target/wheels-py
"$venv/bin/maturin" build --release -m python/Cargo.toml -o target/wheels-py
"$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps target/wheels-py/evokernel-*.whl
# From the tests folder, so `import evokernel` is the installed wheel, not the source tree.
cd python/tests && "../../$venv/bin/python" -m pytest -q
