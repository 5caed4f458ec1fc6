#!/usr/bin/env bash
# idle-priority.sh COMMAND...: run COMMAND at the lowest CPU priority, so that it takes only
# what the cores would otherwise leave idle (CI's release build and package preparations beside
# the tests, the model checker beside nextest).
#
# Its callers start it in a session of its own (setsid), and where the kernel schedules each
# session as one group (autogroups, on by default on Debian and Ubuntu), a nice value counts
# only against the processes of the same session: a niced compile in a session of its own took
# a full share of the cores from the tests beside it. So the session's group is made nice too
# (lowering one's own priority needs no privilege; where autogroups are off there is no file).
set -euo pipefail
if [ -w /proc/self/autogroup ]; then
    echo 19 2>/dev/null >/proc/self/autogroup || true
fi
exec nice -n 19 "$@"
