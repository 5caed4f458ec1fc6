#!/usr/bin/env bash
# Prints the release wringer binary a recipe runs: $WRINGER_BIN when set, else this tree's,
# built first. With --bug-injection, the build with transport bugs switchable
# (WRINGER_TRANSPORT_BUG): $WRINGER_BUG_BIN when set, else `just bug-injection-build`'s.
# CI builds both once and hands every stage the same binaries, so no stage compiles, and none
# runs cargo (which links target/release/wringer anew) while another stage runs it.
set -euo pipefail
if [ "${1:-}" = --bug-injection ]; then
    name=WRINGER_BUG_BIN
    built=target/bug-injection/release/wringer
    build() { just bug-injection-build; }
else
    name=WRINGER_BIN
    built=${CARGO_TARGET_DIR:-target}/release/wringer
    build() { cargo build --release -q -p wringer; }
fi
given=${!name:-}
if [ -n "$given" ]; then
    if [ ! -x "$given" ]; then
        echo "$name=$given is not an executable file" >&2
        exit 2
    fi
    echo "$given"
    exit 0
fi
build >&2 || exit 2
echo "$PWD/$built"
