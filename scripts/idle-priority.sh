#!/usr/bin/env bash
# idle-priority.sh [-n NICE] COMMAND...: run COMMAND at a low CPU priority (nice 19 unless
# given), so that it takes what the cores would otherwise leave idle: CI's release build and
# package preparations beside the tests (19), the model checker beside nextest (10: ahead of
# those, since `just test` waits for it).
#
# Its callers start it in a session of its own (setsid), and where the kernel schedules each
# session as one group (autogroups, on by default on Debian and Ubuntu), a nice value counts
# only against the processes of the same session: a niced compile in a session of its own took
# a full share of the cores from the tests beside it. So the session's group is made nice too
# (lowering one's own priority needs no privilege; where autogroups are off there is no file).
set -euo pipefail
nice=19
if [ "${1:-}" = -n ]; then
    nice=$2
    shift 2
fi
if [ -w /proc/self/autogroup ]; then
    echo "$nice" 2>/dev/null >/proc/self/autogroup || true
fi
exec nice -n "$nice" "$@"
