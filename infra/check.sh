#!/usr/bin/env bash
# Template checks that need Python tools and a cross-compiler (tests/run.sh runs this;
# tests/it/infra.rs checks the template against the code with cargo alone):
#   1. cfn-lint infra/template.yaml
#   2. sam validate --lint
#   3. sam build: cargo-lambda compiles the four functions for arm64 (zig as the linker)
# The build output (.aws-sam/, git-ignored) is removed afterwards.
#
# SAM_BUILD_MODE: `debug` (the default here: the same template, toolchain and linker,
# 3 min 50 s from a cold target on the 2-core machine) or `release` (what `sam deploy`
# ships: 16 min 40 s there, too long for every CI run).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -d .venv/bin ]; then
  export PATH="$PWD/.venv/bin:$PATH"
fi
export SAM_CLI_TELEMETRY=0
export SAM_BUILD_MODE="${SAM_BUILD_MODE:-debug}"

for tool in cfn-lint sam cargo-lambda; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "infra/check.sh: $tool is missing (tests/run.sh installs it into .venv)" >&2
    exit 1
  fi
done

echo "== cfn-lint infra/template.yaml"
cfn-lint infra/template.yaml

echo "== sam validate --lint"
sam validate --lint --template-file infra/template.yaml --region us-east-1

# SAM writes the build, its cache and build.toml under ./.aws-sam (git-ignored): all of
# it goes afterwards. The compiled dependencies stay in the target dir (CARGO_TARGET_DIR:
# tests/run.sh gives this build target/sam-check), under aarch64-unknown-linux-gnu
# (about 2 GB for the debug build) so that the next run only rebuilds what changed.
build_dir=.aws-sam/check-build
cleanup() { rm -rf .aws-sam; }
trap cleanup EXIT
echo "== sam build ($SAM_BUILD_MODE, arm64)"
started=$(date +%s)
sam build --template-file infra/template.yaml --build-dir "$build_dir" \
  --cache-dir .aws-sam/check-cache --region us-east-1
for fn in ReceiverFunction ProcessorFunction SweeperFunction ReconcilerFunction; do
  bootstrap="$build_dir/$fn/bootstrap"
  if [ ! -x "$bootstrap" ]; then
    echo "infra/check.sh: $bootstrap was not built" >&2
    exit 1
  fi
  # Lambda runs arm64 (Graviton): the binary must be an aarch64 ELF.
  if ! head -c 20 "$bootstrap" | od -An -tx1 | tr -d ' \n' | grep -q '^7f454c46.\{28\}b700'; then
    echo "infra/check.sh: $bootstrap is not an aarch64 ELF binary" >&2
    exit 1
  fi
done
echo "== sam build took $(( $(date +%s) - started )) s"
