#!/usr/bin/env bash
# wringer's audit beside the reference race detectors, on the same fixtures, in one run: each
# broken fixture and its correct twin (-DCORRECT) under wringer audit (eBPF), Helgrind
# (valgrind, no rebuild) and ThreadSanitizer (rebuilt with clang -fsanitize=thread). For each
# tool: flagged or not, and its wall time as a ratio to the plain run of the same binary.
# Usage: scripts/race-tools.sh [OUT.md]   (just race-tools)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/race-tools.md}"
wringer="${WRINGER:-target/release/wringer}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"

# folder/name and the wringer checks that judge it.
fixtures=(
    "waits/join_under_lock:waits" "waits/daqiri:waits" "waits/semaphore_join:waits"
    "waits/abba:waits" "waits/three_locks:waits" "waits/lost_wakeup:waits,unbounded-waits"
    "happens_before/close_then_join:fd-lifecycle" "happens_before/handover_condvar:fd-lifecycle"
    "happens_before/handover_semaphore:fd-lifecycle" "happens_before/timer_close:fd-lifecycle"
    "happens_before/stale_handle:fd-lifecycle" "happens_before/double_close:fd-lifecycle"
    "happens_before/inherited_socket:fd-lifecycle" "happens_before/exit_leak:leaks"
)

# Wall seconds of a command (its output discarded); its exit status goes to $work/rc (the
# command substitution that takes the time is a subshell).
timed() {
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >"$work/log" 2>&1
    echo $? >"$work/rc"
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", b - a }' 
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a / b }'; }

{
    echo "| fixture | variant | plain s | wringer | s | Helgrind | s | TSan | s |"
    echo "|---|---|---|---|---|---|---|---|---|"
} >"$out"
declare -A caught=()
sum_p=0 sum_w=0 sum_h=0 sum_t=0
for entry in "${fixtures[@]}"; do
    fx=${entry%%:*}
    checks=${entry#*:}
    name=${fx#*/}
    src="harness/tests/fixtures/$fx.c"
    for variant in broken twin; do
        def=()
        [ $variant = twin ] && def=(-DCORRECT)
        exe="$work/$name-$variant"
        gcc -O0 -g -pthread "${def[@]}" -o "$exe" "$src" || exit 2
        clang -O1 -g -fsanitize=thread -pthread "${def[@]}" -o "$exe-tsan" "$src" || exit 2
        plain=$(timed "$exe")
        args=()
        for c in ${checks//,/ }; do args+=(--check "$c"); done
        wt=$(WRINGER_REPLAYS=0 timed "$wringer" audit "${args[@]}" --audit-backend ebpf --report-dir "$work/report" -- "$exe")
        rc=$(cat "$work/rc")
        w=$([ $rc = 1 ] && echo flagged || { [ $rc = 0 ] && echo clean || echo "error $rc"; })
        ht=$(timed valgrind --tool=helgrind --error-exitcode=99 "$exe")
        rc=$(cat "$work/rc")
        h=$([ $rc = 99 ] && echo flagged || echo clean)
        # halt_on_error=0: a report does not end the program; exitcode marks that one came.
        tt=$(TSAN_OPTIONS="exitcode=66 halt_on_error=0" timed setarch -R "$exe-tsan")
        rc=$(cat "$work/rc")
        t=$([ $rc = 66 ] && echo flagged || echo clean)
        sum_p=$(awk -v a="$sum_p" -v b="$plain" 'BEGIN { print a + b }')
        sum_w=$(awk -v a="$sum_w" -v b="$wt" 'BEGIN { print a + b }')
        sum_h=$(awk -v a="$sum_h" -v b="$ht" 'BEGIN { print a + b }')
        sum_t=$(awk -v a="$sum_t" -v b="$tt" 'BEGIN { print a + b }')
        for tool in w h t; do
            v=${!tool}
            if { [ $variant = broken ] && [ "$v" = flagged ]; } || { [ $variant = twin ] && [ "$v" = clean ]; }; then
                caught[$tool-$variant]=$((${caught[$tool-$variant]:-0} + 1))
            fi
        done
        echo "| $fx | $variant | $(printf '%.3f' "$plain") | $w | $(printf '%.2f' "$wt") | $h | $(printf '%.2f' "$ht") | $t | $(printf '%.2f' "$tt") |" >>"$out"
    done
done
n=${#fixtures[@]}
{
    echo
    echo "Broken fixtures flagged: wringer ${caught[w-broken]:-0}/$n, Helgrind ${caught[h-broken]:-0}/$n, TSan ${caught[t-broken]:-0}/$n."
    echo "Correct twins clean: wringer ${caught[w-twin]:-0}/$n, Helgrind ${caught[h-twin]:-0}/$n, TSan ${caught[t-twin]:-0}/$n."
    echo "Wall time over all runs, as a ratio to the plain runs: wringer $(ratio "$sum_w" "$sum_p")×, Helgrind $(ratio "$sum_h" "$sum_p")×, TSan $(ratio "$sum_t" "$sum_p")× (plain $(printf '%.2f' "$sum_p") s; TSan's binary is its own rebuild)."
} >>"$out"
cat "$out"
