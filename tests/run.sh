#!/usr/bin/env bash
# The whole einmal test suite, from a fresh clone: installs what it needs (moto server
# into ./.venv when it is not importable), then runs every test. The tests start moto
# themselves on free loopback ports and stop it by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c 'import moto.server, flask' >/dev/null 2>&1 && [ ! -x .venv/bin/moto_server ]; then
  echo "== installing moto[server] into .venv"
  python3 -m venv .venv
  .venv/bin/pip install --quiet 'moto[server]>=5,<6'
fi
if [ -x .venv/bin/moto_server ]; then
  export EINMAL_MOTO_BIN="$PWD/.venv/bin/moto_server"
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace --all-targets "$@"
