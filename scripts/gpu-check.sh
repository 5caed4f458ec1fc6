#!/usr/bin/env bash
# The GPU checks on a host with a GPU, NVIDIA (CUDA) or AMD (HIP), and no Rust toolchain, from
# binaries built elsewhere by `just gpu-bundle` (target/gpu-check/wringer and
# target/gpu-check/tests/*): the probe, the two GPU scenarios (gpu-pingpong-rdma skips with its
# reason where there is no RDMA) and the transport's GPU tests. The same bundle runs on either
# vendor: the runtime is chosen when the binaries start (a ROCm outside the loader's path:
# WRINGER_HIP_LIBRARY=/path/to/libamdhip64.so). Results go to $OUT (or reports/gpu-check). Every command has
# a timeout; exit 0 only when everything passed or skipped with a reason.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-reports/gpu-check}"
bundle="${WRINGER_GPU_BUNDLE:-target/gpu-check}"
mkdir -p "$out"
w="$bundle/wringer"
[ -x "$w" ] || { echo "gpu-check: no $w; run 'just gpu-bundle' where Rust is" >&2; exit 2; }
status=0
# The vendor's own view, for the record (whichever tool the host has).
for tool in nvidia-smi rocm-smi rocminfo; do
    command -v "$tool" >/dev/null && timeout 30 "$tool" > "$out/$tool.txt" 2>&1
done
timeout 60 "$w" probe > "$out/probe.txt" 2>&1 || status=1
timeout 60 "$w" probe --json > "$out/probe.json" 2>&1 || status=1
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
