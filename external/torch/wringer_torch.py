#!/usr/bin/env python3
"""wringer-torch: PyTorch's ProcessGroupGloo (the Gloo compiled into a torch wheel) as an exec
program, the torch counterpart of wringer-gloo. Every rank joins a process group through a
FileStore (ranks on one host) or a TCPStore that rank 0 serves (ranks on several hosts), runs
allreduce rounds on a subgroup made with new_group, checks every element, and prints what it
measured as `key=value` lines. Any exception is printed as one `error:` line carrying Gloo's
message (its file:line included) and the process exits 1.

  wringer-torch --rank R --size N --store DIR|tcp:HOST:PORT [--iface IF] [--timeout-ms T]
                [--lazy] [--rounds K] [--sizes 64,4096,...] [--until-error]
                [--leave-before-first-collective RANK] [--stop-after-lazy-accept RANK]
                [--late-to-first-collective RANK:MS]

WRINGER_TORCH_VENV names the torch release to run (a venv, or any Python prefix with torch):
the driver re-executes itself with that venv's Python before it imports torch.

--lazy sets TORCH_GLOO_LAZY_INIT=1: pairs connect on a group's first collective, not at init.
--leave-before-first-collective RANK: after a barrier on the default group, rank RANK exits
  (os._exit, as gloo #520's reproduction does) before the subgroup's first collective.
--stop-after-lazy-accept RANK: rank RANK stops itself (SIGSTOP) the moment its side of the
  subgroup's first lazy connect has a socket (a new TCP socket of its own appears: accepted, or
  opened to the peer), so the peer must fail by its own deadline (the initiator backstop of gloo
  PR #521's review, 1a). The other ranks start that collective only once the watch is armed.
--late-to-first-collective RANK:MS: rank RANK waits MS ms after the barrier before it joins the
  subgroup's first collective, so a fault struck on its `late` line finds its peers inside that
  collective, their lazy connects to it pending.
"""

import os
import sys


def reexec_with_release():
    venv = os.environ.get("WRINGER_TORCH_VENV")
    if not venv:
        return
    python = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return
    if not os.access(python, os.X_OK):
        print(f"error: WRINGER_TORCH_VENV={venv} has no bin/python", flush=True)
        os._exit(2)
    os.execv(python, [python, "-u", os.path.abspath(__file__)] + sys.argv[1:])


reexec_with_release()

import argparse  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from datetime import timedelta  # noqa: E402


def options():
    p = argparse.ArgumentParser(prog="wringer-torch")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--iface", default="")
    p.add_argument("--timeout-ms", type=int, default=5000)
    p.add_argument("--lazy", action="store_true")
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--sizes", default="64,4096,65536,1048576")
    p.add_argument("--until-error", action="store_true")
    p.add_argument("--leave-before-first-collective", type=int, default=None, metavar="RANK")
    p.add_argument("--stop-after-lazy-accept", type=int, default=None, metavar="RANK")
    p.add_argument("--late-to-first-collective", default=None, metavar="RANK:MS")
    o = p.parse_args()
    if o.late_to_first_collective is not None:
        try:
            rank, ms = o.late_to_first_collective.split(":")
            o.late_to_first_collective = (int(rank), int(ms))
        except ValueError:
            p.error("--late-to-first-collective takes RANK:MS")
    if not (0 <= o.rank < o.size):
        p.error("--rank must be below --size")
    if o.timeout_ms <= 0:
        p.error("--timeout-ms must be above 0")
    try:
        o.sizes = [int(s) for s in o.sizes.split(",") if s]
    except ValueError:
        p.error("--sizes takes byte counts separated by commas")
    if not o.sizes or any(s < 4 or s % 4 for s in o.sizes):
        p.error("--sizes are multiples of 4 bytes (float32 elements)")
    return o


def say(line):
    print(line, flush=True)


def own_sockets():
    """The inodes of this process's sockets (its descriptors under /proc/self/fd)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def established(inodes):
    """How many of these sockets are established TCP connections."""
    n = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "01" and cols[9] in inodes:
                n += 1
    return n


def stop_at_next_socket(before):
    """Watch for the first socket that was not there `before`, then stop this whole process."""

    def watch():
        while True:
            new = own_sockets() - before
            if new:
                say(f"stopping: a lazy connect was accepted (socket {sorted(new)[0]})")
                os.kill(os.getpid(), signal.SIGSTOP)
                return
            time.sleep(0.0005)

    threading.Thread(target=watch, daemon=True).start()


def percentile(sorted_values, q):
    i = min(len(sorted_values) - 1, int(round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


# How long the ranks wait for each other to have started (imported torch, reached the store);
# the scenario's own deadline ends a rank that never comes.
STARTED_WITHIN = timedelta(seconds=120)


def main():
    o = options()
    if o.lazy:
        os.environ["TORCH_GLOO_LAZY_INIT"] = "1"
    if o.iface:
        os.environ["GLOO_SOCKET_IFNAME"] = o.iface
    import torch
    import torch.distributed as dist

    say(f"torch version={torch.__version__} lazy={int(o.lazy)} rank={o.rank} size={o.size}")
    timeout = timedelta(milliseconds=o.timeout_ms)
    if o.store.startswith("tcp:"):
        host, port = o.store[4:].rsplit(":", 1)
        store = dist.TCPStore(host, int(port), o.size, o.rank == 0, timeout=STARTED_WITHIN)
    else:
        store = dist.FileStore(os.path.join(o.store, "torch-store"), o.size)
    # Every rank has imported torch before any starts the group: on a loaded machine the
    # imports alone differ by seconds, which the group's timeout is not there to measure.
    store.set(f"wringer-imported-{o.rank}", "1")
    store.wait([f"wringer-imported-{r}" for r in range(o.size)], STARTED_WITHIN)
    if o.store.startswith("tcp:"):
        # From here on the store waits as long as the group does, as it did before.
        store.set_timeout(timeout)
    start = time.monotonic()
    dist.init_process_group("gloo", store=store, rank=o.rank, world_size=o.size, timeout=timeout)
    say(f"initialized connections={established(own_sockets())} init_ms={(time.monotonic() - start) * 1e3:.1f}")
    group = dist.new_group(list(range(o.size)), timeout=timeout)
    dist.barrier()
    say(f"barrier done connections={established(own_sockets())}")
    if o.leave_before_first_collective == o.rank:
        say("leaving before the subgroup's first collective")
        os._exit(0)
    if o.stop_after_lazy_accept is not None:
        # The stopping rank watches from a snapshot of its sockets, and nobody starts the
        # subgroup's connect before that snapshot exists (a store key, which makes no pair).
        if o.stop_after_lazy_accept == o.rank:
            stop_at_next_socket(own_sockets())
            store.set("wringer-armed", "1")
        else:
            store.wait(["wringer-armed"])
    if o.late_to_first_collective and o.late_to_first_collective[0] == o.rank:
        say(f"late to the subgroup's first collective by {o.late_to_first_collective[1]} ms")
        time.sleep(o.late_to_first_collective[1] / 1000)
    mismatches = 0
    checked = 0
    peers = o.size * (o.size - 1) // 2
    for size in o.sizes:
        n = size // 4
        times = []
        for r in range(o.rounds):
            # Rank k contributes (k + 1) * (i + r) at element i: the sum is known everywhere.
            base = torch.arange(n, dtype=torch.float32) + r
            t = base * (o.rank + 1)
            began = time.perf_counter()
            dist.all_reduce(t, group=group)
            times.append((time.perf_counter() - began) * 1e6)
            want = base * (o.size * (o.size + 1) // 2)
            mismatches += int((t != want).sum().item())
            checked += 1
            if r == 0 and size == o.sizes[0]:
                say(f"first collective done connections={established(own_sockets())} pairs={peers}")
        times.sort()
        say(
            f"allreduce bytes={size} rounds={o.rounds} p50_us={percentile(times, 0.5):.1f} "
            f"p99_us={percentile(times, 0.99):.1f}"
        )
    say(f"checked rounds={checked} mismatches={mismatches}")
    if o.until_error:
        say("looping until an error")
        t = torch.ones(1024)
        while True:
            dist.all_reduce(t, group=group)
            time.sleep(0.01)
    # A closing barrier: no rank tears its pairs down while a slower peer is still inside its
    # last allreduce (a close with unread data would reset that peer's connection). Then
    # destroying the groups, part of what a correct Gloo does, before the last line.
    dist.barrier(group=group)
    dist.destroy_process_group()
    say("done")


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:  # noqa: BLE001: every exception is the evidence
        message = " | ".join(line.strip() for line in str(e).splitlines() if line.strip())
        say(f"error: {type(e).__name__}: {message or repr(e)}")
        sys.stderr.flush()
        # os._exit: interpreter teardown runs the groups' destructors, which may wait on the
        # very peer that failed; the error is the verdict's evidence, the exit follows it.
        os._exit(1)
