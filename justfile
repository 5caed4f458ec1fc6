set shell := ["bash", "-euo", "pipefail", "-c"]

# List the recipes.
default:
    @just --list

# Unit and integration tests (nextest, CI profile), clippy with warnings as errors, rustfmt.
test:
    cargo nextest run --workspace --profile ci
    cargo clippy --workspace --all-targets -- -D warnings
    cargo fmt --all --check

# The main job: build in release and run every scenario this machine can run (loopback by default).
test-local hosts="hosts/local.yaml" *args="":
    cargo run --release -q -p harness --bin wringer -- run --hosts {{hosts}} {{args}}

# Parse and check every scenario and host file.
validate:
    cargo run -q -p harness -- validate scenarios hosts

# Our transport against sockperf and iperf3 in one run (ratio table), then the criterion benches.
bench:
    cargo bench -p transport --bench versus
    cargo bench -p transport --bench frame --bench tcp

# Fuzz the frame decoder (not part of CI). cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP lets the stable toolchain accept them.
fuzz seconds="60":
    command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
    cd transport/fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run frame_decoder -- -max_total_time={{seconds}}
