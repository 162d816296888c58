#!/bin/sh
# Regenerate the sample Lambda events under events/ (apigw/, sqs/, schedule/), signed
# with the demo secrets of einmal.toml by the library's own signing code.
#
#   events/regenerate.sh            rewrite the checked-in files (fixed signing time)
#   events/regenerate.sh --check    exit 1 if a checked-in file is stale (the test suite
#                                   runs this: tests/it/lambda_events.rs)
#   events/regenerate.sh --now      sign at the current time into target/lambda-events/
#                                   (what to invoke the receiver with: timestamped
#                                   signatures expire after the tenant's tolerance)
#   events/regenerate.sh --at SECS [--out DIR]
set -eu
root=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
cd "$root"
exec cargo run --quiet -p einmal-tests --bin regenerate-events -- --root "$root" "$@"
