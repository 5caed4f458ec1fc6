#!/usr/bin/env bash
# Prints the release wringer binary a recipe runs: $WRINGER_BIN when set, else this tree's,
# built first. CI builds once and hands every stage the same binary, so no stage compiles, and
# none runs cargo (which links target/release/wringer anew) while another stage runs it.
set -euo pipefail
if [ -n "${WRINGER_BIN:-}" ]; then
    if [ ! -x "$WRINGER_BIN" ]; then
        echo "WRINGER_BIN=$WRINGER_BIN is not an executable file" >&2
        exit 2
    fi
    echo "$WRINGER_BIN"
    exit 0
fi
cargo build --release -q -p wringer >&2 || exit 2
echo "$PWD/${CARGO_TARGET_DIR:-target}/release/wringer"
