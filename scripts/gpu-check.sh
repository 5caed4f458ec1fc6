#!/usr/bin/env bash
# The GPU checks on a host with an NVIDIA GPU and no Rust toolchain: binaries built elsewhere
# (`cargo build --release -p harness` and `cargo test -p transport --features gpu,rdma --test gpu
# --no-run`), copied to target/release/wringer and target/gpu-tests. Results go to $OUT (or
# ./reports/gpu-check): the probe, the two GPU scenarios' reports, and the GPU test output.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-reports/gpu-check}"
mkdir -p "$out"
w=target/release/wringer
status=0
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
timeout 60 "$w" probe > "$out/probe.txt" 2>&1 || status=1
cat "$out/probe.txt"
CI=true timeout 300 "$w" run --hosts hosts/local.yaml --report-dir "$out/run" \
    scenarios/gpu-pingpong-tcp.yaml scenarios/gpu-pingpong-rdma.yaml || status=1
cat "$out/run/summary.md" 2>/dev/null
for t in target/gpu-tests/*; do
    [ -x "$t" ] || continue
    timeout 120 "$t" --test-threads 1 --nocapture > "$out/$(basename "$t").txt" 2>&1 || status=1
    tail -5 "$out/$(basename "$t").txt"
done
exit $status
