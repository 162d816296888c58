#!/usr/bin/env bash
# The whole einmal test suite, from a fresh clone: installs what it needs (PostgreSQL from
# the Debian package when missing, for the PostgreSQL destination tests; moto server,
# and the template tools aws-sam-cli, cfn-lint, cargo-lambda, ziglang into ./.venv; the
# aarch64 Rust target), then runs every test and the template checks (infra/check.sh:
# cfn-lint, sam validate --lint, sam build for arm64). The tests start moto themselves
# (single-threaded, with the venv's Python: tests/moto_single_threaded.py) on free
# loopback ports and stop it by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

# Always the project's own moto in .venv: a moto elsewhere on the machine may be another
# release (5.2.1 lacks what tests/moto_single_threaded.py imports from 5.2.5).
if [ ! -x .venv/bin/moto_server ]; then
  echo "== installing moto[server] into .venv"
  [ -x .venv/bin/pip ] || python3 -m venv .venv
  .venv/bin/pip install --quiet 'moto[server]>=5.2.5,<6'
fi
# The template tools, in the same venv (zig links the arm64 binaries for cargo-lambda).
if [ ! -x .venv/bin/sam ] || [ ! -x .venv/bin/cfn-lint ] || [ ! -x .venv/bin/cargo-lambda ] \
   || ! .venv/bin/python -c 'import ziglang' >/dev/null 2>&1; then
  echo "== installing aws-sam-cli, cfn-lint, cargo-lambda, ziglang into .venv"
  [ -x .venv/bin/pip ] || python3 -m venv .venv
  .venv/bin/pip install --quiet 'aws-sam-cli>=1.170,<2' 'cfn-lint>=1.58,<2' \
    'cargo-lambda>=1.9,<2' ziglang
fi
if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
  echo "== rustup target add aarch64-unknown-linux-gnu"
  rustup target add aarch64-unknown-linux-gnu
fi
# The PostgreSQL destination tests start a real server (Debian's package: initdb,
# postgres, pg_isready in /usr/lib/postgresql/<N>/bin); in this script they must not skip.
if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null && [ -z "${EINMAL_POSTGRES_BIN:-}" ]; then
  echo "== installing postgresql (apt-get)"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends postgresql
fi
export EINMAL_REQUIRE_POSTGRES=1
# The console's browser test drives Debian's chromium through chromedriver (WebDriver);
# in this script it must not skip.
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  echo "== installing chromium chromium-driver (apt-get)"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends chromium chromium-driver
fi
export EINMAL_REQUIRE_CHROMIUM=1
# The HTTP destination's signatures are checked with Python's `standardwebhooks` too (the
# library a user's app verifies with), and the providers' official SDKs check einmal's
# provider schemes (tests/it/provider_sdks.rs), all in the venv's Python: one pip command,
# skipped when every package is there.
if ! .venv/bin/python -c 'import standardwebhooks, razorpay, coinbase_commerce, onlinepayments.sdk, svix, hubspot, sendgrid' >/dev/null 2>&1; then
  echo "== installing standardwebhooks and the provider SDKs into .venv"
  .venv/bin/pip install --quiet 'standardwebhooks>=1.0.1,<2' 'razorpay>=1.4,<3' \
    'coinbase-commerce==1.0.1' 'onlinepayments-sdk-python3>=7,<11' 'svix>=1.80,<3' \
    'hubspot-api-client>=11,<13' 'sendgrid>=6.12,<7'
fi
export EINMAL_REQUIRE_PYTHON_VERIFIER=1
export EINMAL_REQUIRE_PROVIDER_SDKS=1
if [ -x .venv/bin/moto_server ]; then
  export EINMAL_MOTO_BIN="$PWD/.venv/bin/moto_server"
fi

# The `cargo lambda watch` test runs every function against moto; in this script it must
# not skip.
export EINMAL_CARGO_LAMBDA="$PWD/.venv/bin/cargo-lambda"
export EINMAL_REQUIRE_CARGO_LAMBDA=1
export PATH="$PWD/.venv/bin:$PATH"

# The template checks (infra/check.sh: cfn-lint, sam validate, sam build for arm64) run
# beside the Rust checks, at the lowest CPU priority and in their own target dir (the
# cross build locks target/debug too): the tests wait on moto and on timers much of the
# time, and the arm64 build fills those gaps instead of adding ~7 minutes after them.
infra_log="$PWD/target/infra-check.log"
mkdir -p target
echo "== infra/check.sh started in the background (log: target/infra-check.log)"
# In a session of its own, so that a failed fmt or clippy stops the whole build with it.
CARGO_TARGET_DIR="$PWD/target/sam-check" setsid nice -n 19 ./infra/check.sh >"$infra_log" 2>&1 &
infra_pid=$!
trap 'kill -- -"$infra_pid" 2>/dev/null || true' EXIT

echo "== cargo fmt --check"
cargo fmt --all -- --check
# Clippy lints the workspace's crates while they are compiled for the tests: clippy-driver
# as the workspace's rustc wrapper (what `cargo clippy` sets up, with -D warnings as it
# passes it) over the test build, so the dependencies are compiled once, not a second
# time in check mode (that second pass was 9 of the suite's 32 minutes). Every target the
# tests build is linted: libraries in both configurations, binaries, tests, benches.
clippy_driver="$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver || true)"
if [ ! -x "$clippy_driver" ]; then
  echo "tests/run.sh: clippy-driver not found (rustup component add clippy)" >&2
  exit 1
fi
export RUSTC_WORKSPACE_WRAPPER="$clippy_driver"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
echo "== cargo test --no-run (compiled with clippy -D warnings)"
cargo test --workspace --all-targets --no-run
# Every test binary runs even when one fails (--no-fail-fast), and the template checks
# run even when a test failed: one run reports everything that is broken. The script
# still exits non-zero if either failed. The CLI's tests run beside the rest (each test
# binary has its own moto, which answers one request at a time): most of both wait on
# moto, servers and timers, not on the CPU.
echo "== cargo test (the CLI's beside the rest; its log follows theirs)"
cli_log="$PWD/target/cli-tests.log"
cargo test -p einmal-cli --all-targets --no-fail-fast "$@" >"$cli_log" 2>&1 &
cli_pid=$!
tests_status=0
cargo test --workspace --exclude einmal-cli --all-targets --no-fail-fast "$@" || tests_status=$?
cli_status=0
wait "$cli_pid" || cli_status=$?
cat "$cli_log"
[ "$cli_status" -eq 0 ] || tests_status=$cli_status
echo "== infra/check.sh (cfn-lint, sam validate --lint, sam build)"
check_status=0
wait "$infra_pid" || check_status=$?
cat "$infra_log"
if [ "$tests_status" -ne 0 ] || [ "$check_status" -ne 0 ]; then
  echo "== FAILED: cargo test exit $tests_status, infra/check.sh exit $check_status" >&2
  exit 1
fi
