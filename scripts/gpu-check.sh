#!/usr/bin/env bash
# The GPU checks on a host with an NVIDIA GPU and no Rust toolchain, from binaries built
# elsewhere by `just gpu-bundle` (target/gpu-check/wringer and target/gpu-check/tests/*): the
# probe, the two GPU scenarios (gpu-pingpong-rdma skips with its reason where there is no RDMA)
# and the transport's GPU tests. Results go to $OUT (or reports/gpu-check). Every command has
# a timeout; exit 0 only when everything passed or skipped with a reason.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-reports/gpu-check}"
bundle="${WRINGER_GPU_BUNDLE:-target/gpu-check}"
mkdir -p "$out"
w="$bundle/wringer"
[ -x "$w" ] || { echo "gpu-check: no $w; run 'just gpu-bundle' where Rust is" >&2; exit 2; }
status=0
timeout 30 nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "nvidia-smi: not available" >> "$out/nvidia-smi.txt"
timeout 60 "$w" probe > "$out/probe.txt" 2>&1 || status=1
cat "$out/probe.txt"
CI=true timeout 300 "$w" run --hosts hosts/local.yaml --report-dir "$out/run" \
    scenarios/gpu-pingpong-tcp.yaml scenarios/gpu-pingpong-rdma.yaml || status=1
cat "$out/run/summary.md" 2>/dev/null
for t in "$bundle"/tests/*; do
    [ -x "$t" ] || continue
    name="$(basename "$t")"
    timeout 120 "$t" --test-threads 1 --nocapture > "$out/$name.txt" 2>&1 || status=1
    grep -E "^test |test result|skipped" "$out/$name.txt"
done
echo "gpu-check: exit $status, results in $out"
exit $status
