#!/usr/bin/env bash
# The Slurm cleanup checks (`just test-slurm`): after a SIGINT, a watchdog kill and a SIGKILL
# of the coordinator, the scheduler must show no step of the run within 5 s; and while ranks
# run, the run token shows in no command line, environment or `scontrol` output. Each case starts
# its own test cluster (hosts/slurm-containers.yaml) and ranks that hold their step.
#   scripts/slurm-cleanup-check.sh WRINGER
set -uo pipefail
w="${1:?usage: slurm-cleanup-check.sh WRINGER}"
out="reports/slurm-cleanup"
rm -rf "$out"; mkdir -p "$out"
failed=0
fail() { echo "slurm cleanup: FAIL: $*"; failed=1; }

# Start a held run in the background; sets pid, run id and the controller's container name.
start_held() {
    local case=$1
    "$w" run --hosts hosts/slurm-containers.yaml --report-dir "$out/$case" hosts/slurm/hold.yaml \
        > "$out/$case.log" 2>&1 &
    pid=$!
    run=""
    for _ in $(seq 1 600); do
        run=$(sed -n 's/^wringer run \([^:]*\):.*/\1/p' "$out/$case.log" | head -1)
        [ -n "$run" ] && break
        sleep 0.1
    done
    ctl="wringer-$run-h3"
    # Until the ranks hold their step (cluster start-up takes 20-60 s here).
    for _ in $(seq 1 1200); do
        steps_of_run | grep -q . && return 0
        kill -0 "$pid" 2>/dev/null || { fail "$case: the run ended before its step started: $(tail -3 "$out/$case.log")"; return 1; }
        sleep 0.1
    done
    fail "$case: no step of run $run appeared"
    return 1
}

# The run's steps, as the controller lists them (from inside its container: that works
# whether or not the coordinator, and its munged, still live).
steps_of_run() {
    docker exec "$ctl" squeue --steps --noheader --format='%i %j' 2>/dev/null | grep " wringer-$run-" | grep -v -- "-ctl$"
}

# Milliseconds until the run has no step listed, or "never" after 10 s. An unreachable
# controller counts as not yet.
time_to_gone() {
    local t0
    t0=$(date +%s%3N)
    while [ $(( $(date +%s%3N) - t0 )) -lt 10000 ]; do
        if docker exec "$ctl" squeue --steps --noheader --format='%i %j' > "$out/squeue.txt" 2>/dev/null \
            && ! grep " wringer-$run-" "$out/squeue.txt" | grep -qv -- "-ctl$"; then
            echo $(( $(date +%s%3N) - t0 ))
            return
        fi
        sleep 0.1
    done
    echo never
}

within5() { [ "$1" != never ] && [ "$1" -le 5000 ]; }

# The run token (32 hex digits) must be on no command line and in no environment of the
# step's processes, nor in anything `scontrol show job` or `show step` prints.
token_hidden() {
    local seen=""
    docker exec "$ctl" sh -c 'scontrol show job -d; scontrol show step' > "$out/scontrol.txt" 2>&1
    grep -qiE '(^|[^0-9a-f])[0-9a-f]{32}([^0-9a-f]|$)' "$out/scontrol.txt" && seen="scontrol"
    for node in 0 1; do
        docker exec "wringer-$run-h$node" sh -c \
            'for p in $(pgrep -f "wringer.* rank "); do tr "\0" "\n" < /proc/$p/cmdline; tr "\0" "\n" < /proc/$p/environ; done' \
            > "$out/procs-h$node.txt" 2>/dev/null
        grep -q "rank" "$out/procs-h$node.txt" || seen="$seen (no rank process found on h$node)"
        grep -qiE '(^|[^0-9a-f])[0-9a-f]{32}([^0-9a-f]|$)|WRINGER_RUN_TOKEN' "$out/procs-h$node.txt" && seen="$seen h$node"
    done
    [ -z "$seen" ] || fail "token: a 32-hex-digit value or WRINGER_RUN_TOKEN shows in: $seen (see $out)"
    [ -z "$seen" ] && echo "slurm cleanup: token: in no command line, environment or scontrol output of the step"
}

# 1. SIGINT: the coordinator cancels the step, checks squeue, and tears the cluster down.
if start_held sigint; then
    token_hidden
    kill -INT "$pid"
    gone=$(time_to_gone)
    wait "$pid"; code=$?
    echo "slurm cleanup: SIGINT: step gone from squeue after ${gone} ms (coordinator exit $code)"
    within5 "$gone" || fail "SIGINT: the step was still listed 5 s after the signal"
    grep -q "still in squeue" "$out/sigint/results.json" 2>/dev/null && fail "SIGINT: the run reports a leftover step"
fi

# 2. The watchdog: the step outlives its deadline; the coordinator must end it.
"$w" run --hosts hosts/slurm-containers.yaml --report-dir "$out/watchdog" hosts/slurm/watchdog.yaml \
    > "$out/watchdog.log" 2>&1
code=$?
if [ $code != 1 ]; then
    fail "watchdog: exit $code, want 1 (the step outlives its deadline): $(tail -3 "$out/watchdog.log")"
elif ! grep -q "hung in step 0 (stall) past its" "$out/watchdog/results.json"; then
    fail "watchdog: the failure is not the watchdog's: $(tail -3 "$out/watchdog.log")"
elif grep -q "still in squeue\|process left behind" "$out/watchdog/results.json"; then
    fail "watchdog: a step of the run was still listed 5 s after it was cancelled"
else
    echo "slurm cleanup: watchdog: the run failed on the deadline, and its step left squeue within 5 s"
fi

# 3. SIGKILL: nothing of the coordinator runs any more. srun dies with it (PR_SET_PDEATHSIG),
#    which closes the tasks' stdin, and the ranks exit; salloc's pipe closes, and it gives the
#    allocation back.
if start_held sigkill; then
    kill -KILL "$pid"
    gone=$(time_to_gone)
    # (bash reports the kill when it reaps the job; that is the point, not news)
    { wait "$pid"; } 2>/dev/null
    echo "slurm cleanup: SIGKILL: step gone from squeue after ${gone} ms"
    within5 "$gone" || fail "SIGKILL: the step was still listed 5 s after the coordinator died"
    jobs=""
    for _ in $(seq 1 50); do
        jobs=$(docker exec "$ctl" squeue --noheader --format='%i %j %T' 2>/dev/null | grep " wringer-$run" || true)
        [ -z "$jobs" ] && break
        sleep 0.1
    done
    [ -n "$jobs" ] && fail "SIGKILL: the allocation was not given back within 5 s: $jobs"
    # munged here outlives the coordinator by 3 s, for salloc to give the allocation back.
    left=""
    for _ in $(seq 1 60); do
        left=$(ps -eo pid,args | grep -E "salloc|srun|munged" | grep -F "$run" | grep -v grep || true)
        [ -z "$left" ] && break
        sleep 0.1
    done
    [ -n "$left" ] && fail "SIGKILL: processes of the run still here 6 s later: $left"
    # What a killed coordinator leaves on purpose for the next run's sweep: its containers and
    # networks. Removed here, so the check leaves nothing behind.
    docker ps -aq --filter "label=wringer.pid=$pid" | xargs -r docker rm -f > /dev/null
    docker network ls -q --filter "label=wringer.pid=$pid" | xargs -r docker network rm > /dev/null
    rm -rf "/tmp/wringer-slurm-$run" "/tmp/wringer-keys-$run"
fi

[ $failed = 0 ] && echo "slurm cleanup: all three cases passed"
exit $failed
