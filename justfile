set shell := ["bash", "-euo", "pipefail", "-c"]

# List the recipes.
default:
    @just --list

# Unit and integration tests (nextest, CI profile), the transport's doctests, clippy with warnings as errors, rustfmt, and the model checker (beside the tests, at low priority: they leave the cores idle more than half the time). The report's browser test needs Chromium (installed when missing).
test: test-deps test-build
    #!/usr/bin/env bash
    set -euo pipefail
    mkdir -p target
    rm -f target/model-check.rc
    # In a process group of its own, ended with this recipe whichever way it ends (a failing
    # clippy leaves no model checker running); at a low priority, behind the tests
    # (scripts/idle-priority.sh says why it sets the session's too).
    setsid bash -c 'bash scripts/idle-priority.sh -n 10 just model-check > target/model-check.out 2>&1; echo $? > target/model-check.rc' &
    model=$!
    trap 'kill -TERM -- "-$model" 2>/dev/null || true' EXIT
    # Two tests a core: at one, the cores sat idle more than half the time (the tests wait on
    # children, timers and audited fixtures). On this 2-core machine: 331 s at 2 threads, 204 s
    # at 4, 263 s at 4 beside CI's niced release build; every test passed each time.
    rc=0
    WRINGER_REPLAYS=0 WRINGER_PTXAS="$PWD/{{ptxas}}" WRINGER_REQUIRE_PTXAS=1 WRINGER_REQUIRE_HIP=1 cargo nextest run {{nextest_args}} --test-threads $(( $(nproc) * 2 )) || rc=$?
    if [ "$rc" = 0 ]; then
        # nextest runs no doctests: the transport's compile_fail examples (a lent receive slot cannot be reused while it is out) run here. Over the whole workspace, as nextest built it: one package alone unifies its dependencies' features differently and rebuilt them (about a minute in CI).
        cargo test --doc --workspace --all-features
        cargo clippy --workspace --all-targets --all-features -- -D warnings
        # The GPU feature without RDMA must build on its own too.
        cargo clippy -p wringer-transport --features gpu --all-targets -- -D warnings
        cargo fmt --all --check
    fi
    wait "$model" || true
    cat target/model-check.out
    [ "$rc" = 0 ] || exit "$rc"
    [ "$(cat target/model-check.rc 2>/dev/null)" = 0 ] || { echo "the model checker failed" >&2; exit 1; }

nextest_args := "--workspace --all-features --profile ci"

# What the tests need installed: the build's packages, the fixtures' tools, the GPU toolchains (no GPU needed) and the external programs. CI installs them beside the test build.
[private]
test-deps: build-deps (apt "chromium" "strace" "xz-utils" "zstd" "make" "git" "liburing-dev" "binutils") cuda-tools hip-tools external

# The test binaries, built (what `just test` runs; CI builds them while test-deps installs).
[private]
test-build: build-deps
    cargo nextest run {{nextest_args}} --no-run

# The main job: build in release and run every scenario this machine can run (loopback by default), the external programs' scenarios (Gloo, libfabric, UCX) included. Where the kernel has no RDMA device, `wringer run` sends the scenarios that need RDMA to the profile's soft-RoCE VM (`rdma_vm:`, set up once here); WRINGER_NO_VM=1 skips them instead.
test-local hosts="hosts/local.yaml" *args="": build-deps (apt "strace") external rxe-if-needed
    w=$(bash scripts/wringer-bin.sh) || exit 2; PATH="$PWD/target/external:$PATH" "$w" run --hosts {{hosts}} {{args}}

# Set up the soft-RoCE VM once (setup-rxe) where this kernel has no RDMA; whether a run uses it is wringer's decision (the profile's `rdma_vm:`).
[private]
rxe-if-needed:
    #!/usr/bin/env bash
    set -euo pipefail
    [ "${WRINGER_NO_VM:-0}" = 1 ] || [ -e /sys/class/infiniband ] && exit 0
    command -v vng >/dev/null && [ -d /opt/wringer-vm/boot ] && exit 0
    echo "no RDMA device in this kernel: setting up the soft-RoCE VM once (just setup-rxe; WRINGER_NO_VM=1 opts out)"
    mkdir -p target
    just setup-rxe > target/setup-rxe.log 2>&1 || { echo "setup-rxe failed (log: target/setup-rxe.log); WRINGER_NO_VM=1 runs without the VM" >&2; tail -5 target/setup-rxe.log >&2; exit 1; }

# The nightly job: test-local (and the scenarios against an inventory, when given), the benchmarks, then the HTML report with history in reports/site/.
nightly hosts="": build-deps (apt "sockperf" "iperf3")
    #!/usr/bin/env bash
    set -uo pipefail
    run="reports/nightly-$(date -u +%Y%m%d-%H%M%S)"
    cargo build --release -q -p wringer || exit 2
    w="cargo run --release -q -p wringer --bin wringer --"
    status=0
    $w run --hosts hosts/local.yaml --report-dir "$run/local" || status=1
    $w bench --out "$run/local" || status=1
    dirs=("$run/local")
    if [ -n "{{hosts}}" ]; then
        $w run --hosts "{{hosts}}" --report-dir "$run/hosts" || status=1
        [ -f "$run/hosts/results.json" ] && dirs+=("$run/hosts")
    fi
    $w report "${dirs[@]}" --history reports/history.jsonl --out reports/site/index.html || status=1
    cat "${dirs[@]/%//summary.md}" > reports/site/summary.md
    echo "nightly: $run, page reports/site/index.html"
    exit $status

# Parse and check every scenario and the runnable host profiles (the example pair inventories hold placeholders on purpose).
validate:
    cargo run -q -p wringer -- validate scenarios hosts/local.yaml hosts/containers.yaml hosts/rxe.yaml hosts/rxe-vm.yaml hosts/rxe-vm-pair.yaml hosts/slurm-containers.yaml hosts/slurm/hold.yaml hosts/slurm/watchdog.yaml

# The programs the exec scenarios run: Debian's Gloo, libfabric and UCX, and wringer-gloo (a small driver for the real Gloo, external/gloo) built into target/external; also verbs_teardown, the verbs audit's C fixture.
external: (apt "libgloo-dev" "libfabric-bin" "ucx-utils" "g++" "libibverbs-dev")
    #!/usr/bin/env bash
    set -euo pipefail
    # Each program is built only when its source is newer, and renamed into place whole, so a
    # stage running beside this one never starts a half-written binary.
    build() { # NAME SOURCE COMPILER [FLAGS AND LIBRARIES, after the source]
        local out=target/external/$1 src=$2 cc=$3
        shift 3
        [ "$out" -nt "$src" ] && return 0
        $cc -O2 -Wall -Wextra -Werror -o "$out.$$" "$src" "$@" && mv -f "$out.$$" "$out"
    }
    mkdir -p target/external
    build wringer-gloo external/gloo/wringer_gloo.cc g++ -std=c++17 -lgloo -pthread
    build verbs_teardown harness/tests/fixtures/broken/verbs_teardown.c gcc -libverbs

# The torch releases the torch scenarios run against, each in a venv under target/torch/: the newest, and the oldest whose ProcessGroupGloo honours TORCH_GLOO_LAZY_INIT (2.8.0; 2.7.1 and older do not have it). Also your own builds: `just external-torch path/to/torch-*.whl`. Idempotent: installs only the missing ones, and none when WRINGER_TORCH names venvs to run instead. Installs wringer-torch (the driver, external/torch) into target/external.
external-torch *wheels="": (apt "python3-venv")
    #!/usr/bin/env bash
    set -euo pipefail
    mkdir -p target/external target/torch
    install -m 755 external/torch/wringer_torch.py target/external/wringer-torch
    # WRINGER_TORCH names the venvs to run instead: then none is installed.
    if [ -z "${WRINGER_TORCH:-}" ]; then
        for v in {{torch_releases}}; do bash scripts/torch-venv.sh "target/torch/$v" "torch==$v"; done
    fi
    for w in {{wheels}}; do
        v=$(basename "$w" | cut -d- -f2 | cut -d+ -f1)
        bash scripts/torch-venv.sh "target/torch/$v" "$(realpath "$w")"
    done

torch_releases := "2.8.0 2.15.0"

# The torch scenarios (PyTorch's own Gloo: allreduce, #520's rank that leaves before a lazy subgroup's first collective, peer death and freeze, a lazy connect left half done), once per installed release, on loopback; then their cross-host variants on the container hosts (host kill and link cut in a lazy subgroup's first collective). WRINGER_TORCH=venv[:venv...] runs your own torch builds instead (and installs none).
test-torch hosts="hosts/local.yaml" *args="": build-deps external-torch
    #!/usr/bin/env bash
    set -uo pipefail
    w=$(bash scripts/wringer-bin.sh) || exit 2
    $w run --hosts {{hosts}} {{args}} scenarios/torch-*.yaml
    first=$?
    [ $first = 2 ] && exit 2
    second=0
    if [ "{{hosts}}" = "hosts/local.yaml" ]; then
        just setup-containers || exit 1
        $w run --hosts hosts/containers.yaml --filter xhost {{args}} scenarios/torch-*.yaml
        second=$?
        # A torch allreduce (2 ranks, the newest release, or the last venv WRINGER_TORCH names)
        # among the real programs the audit must pass clean, with each recorder (docs/audit.md).
        if [ -n "${WRINGER_TORCH:-}" ]; then v=$(realpath "${WRINGER_TORCH##*:}"); else v="$PWD/target/torch/$(ls target/torch | sort -V | tail -1)"; fi
        for b in ebpf strace; do
            WRINGER_TORCH_VENV="$v" PATH="$PWD/target/external:$PATH" $w audit --audit-backend $b --ranks 2 --deadline 300s --report-dir reports/torch-audit-$b -- wringer-torch --rank {rank} --size 2 --store {dir} --iface lo --timeout-ms 60000 --rounds 5 --sizes 64,65536 || second=1
        done
    fi
    exit $(( first > second ? first : second ))

# Build the container test-host image locally (debootstrap + docker import; no registry needed). Idempotent.
setup-containers: (apt "debootstrap" "openssh-client")
    bash hosts/image/build.sh wringer-host:bookworm

# Build the Slurm test-cluster image locally (Debian's slurmctld, slurmd and munge, from this machine's release, since the clients here must speak the daemons' release), and install the clients here (this machine is the login node). Idempotent.
setup-slurm: (apt "debootstrap" "openssh-client" "munge" "slurm-client")
    bash hosts/image/build.sh wringer-slurm:local "$(. /etc/os-release && echo "$VERSION_CODENAME")" slurmctld,slurmd,slurm-client,munge

# The cross-host TCP scenarios, tcp-peer-death (a rank SIGKILLed, one SIGSTOPped, by PID on their nodes) and tcp-pingpong-8rank as Slurm job steps (srun), on a real Slurm cluster of containers started for the run (slurmctld and three slurmd); then the cleanup checks (after SIGINT, a watchdog kill and a coordinator SIGKILL, no step of the run is left in squeue within 5 s).
test-slurm hosts="hosts/slurm-containers.yaml" *args="": build-deps setup-slurm external
    #!/usr/bin/env bash
    set -uo pipefail
    w=$(bash scripts/wringer-bin.sh) || exit 2
    PATH="$PWD/target/external:$PATH" $w run --hosts {{hosts}} {{args}} \
        scenarios/tcp-xhost-*.yaml scenarios/gloo-xhost-*.yaml scenarios/tcp-peer-death.yaml scenarios/tcp-pingpong-8rank.yaml
    first=$?
    [ $first = 2 ] && exit 2
    second=0
    if [ "{{hosts}}" = "hosts/slurm-containers.yaml" ]; then
        # The cleanup checks: a Rust test that reads the runs' typed results (harness/tests/slurm_cleanup.rs),
        # against the binary the scenarios above ran. WRINGER_SLURM_CLEANUP_TEST names the test's
        # binary, built already (CI keeps the one its test build made), else cargo builds it.
        if [ -n "${WRINGER_SLURM_CLEANUP_TEST:-}" ]; then
            WRINGER_BIN="$w" "$WRINGER_SLURM_CLEANUP_TEST" --ignored --nocapture
        else
            WRINGER_BIN="$w" cargo nextest run --release -p wringer --test slurm_cleanup --run-ignored only --no-capture
        fi
        second=$?
    fi
    exit $(( first > second ? first : second ))

# Make this machine able to run the rxe-vm profile: qemu, rdma-core, perftest, virtme-ng and a Debian kernel with rdma_rxe. Idempotent.
setup-rxe:
    bash hosts/vm/setup-rxe.sh

# The RDMA lock held across a join (DAQIRI's deadlock, half of it) switched into the transport (a bug-injection build): rdma-graceful-shutdown must fail in the soft-RoCE VM, and pass without the bug.
rdma-blind-spot: build-deps setup-rxe
    #!/usr/bin/env bash
    set -uo pipefail
    w=$(bash scripts/wringer-bin.sh --bug-injection) || exit 2
    out=reports/rdma-blind-spot
    WRINGER_TRANSPORT_BUG=lock-across-join $w run --hosts hosts/rxe-vm.yaml --report-dir $out/with-bug scenarios/rdma-graceful-shutdown.yaml
    with=$?
    $w run --hosts hosts/rxe-vm.yaml --report-dir $out/without scenarios/rdma-graceful-shutdown.yaml
    without=$?
    grep -h "stats_max_lock_wait\|lock" $out/with-bug/summary.md || true
    # The wait-for audit must name the join under the registry lock, not only the bound.
    audited=0; grep -q "wait under a lock" $out/with-bug/summary.md && audited=1
    if [ $with = 1 ] && [ $without = 0 ] && [ $audited = 1 ]; then echo "rdma-blind-spot: caught with the bug (the bound and the wait-for audit), passed without"; else echo "rdma-blind-spot: with the bug exit $with (want 1), without exit $without (want 0), wait-for audit finding $audited (want 1)"; exit 1; fi

# The verbs audit against RDMA lifecycle bugs in the soft-RoCE VM: a broken C verbs program (harness/tests/fixtures/broken/verbs_teardown.c) is flagged and its correct twin is not; and three bugs switched into the transport (a bug-injection build), one per copy of rdma-graceful-shutdown, each make it fail with the audit naming its invariant. One run, so the VM boots once.
rdma-verbs-bugs: build-deps setup-rxe external
    #!/usr/bin/env bash
    set -uo pipefail
    out=reports/rdma-verbs-bugs
    rm -rf $out && mkdir -p $out/scenarios
    w=$(bash scripts/wringer-bin.sh --bug-injection) || exit 2
    pairs="destroy-with-receives-posted:qp-destroyed-with-outstanding-wrs dereg-under-posted-receive:mr-dereg-under-posted-wr buffers-to-pool-before-join:memory-reused-under-posted-wr"
    bugs=""
    for pair in $pairs; do
        bug=${pair%%:*}
        sed "s/^name: rdma-graceful-shutdown$/name: rdma-graceful-shutdown-$bug/" scenarios/rdma-graceful-shutdown.yaml > $out/scenarios/rdma-graceful-shutdown-$bug.yaml
        bugs="$bugs${bugs:+,}rdma-graceful-shutdown-$bug:$bug"
    done
    WRINGER_TRANSPORT_BUG=$bugs $w run --replays 0 --hosts hosts/rxe-vm.yaml --report-dir $out/run \
        harness/tests/fixtures/exec/verbs-teardown-*.yaml $out/scenarios/*.yaml
    [ $? = 2 ] && exit 2
    python3 - $out/run/results.json $pairs <<'PY'
    import json, sys
    got = {s["name"]: s for s in json.load(open(sys.argv[1]))["scenarios"]}
    ok = True
    broken, correct = got["verbs-teardown-broken"], got["verbs-teardown-correct"]
    fixture = broken["verdict"] == "fail" and "verbs: mr-dereg-under-posted-wr" in json.dumps(broken["evidence"]) and correct["verdict"] == "pass"
    print(f"rdma-verbs-bugs: the C fixture is {broken['verdict']}, its correct twin {correct['verdict']}" + ("" if fixture else " (want fail naming mr-dereg-under-posted-wr, and pass)"))
    ok &= fixture
    for pair in sys.argv[2:]:
        bug, check = pair.split(":")
        s = got[f"rdma-graceful-shutdown-{bug}"]
        caught = s["verdict"] == "fail" and f"verbs: {check}" in json.dumps(s)
        print(f"rdma-verbs-bugs: {bug} " + (f"caught as {check}" if caught else f"was not caught as {check} (verdict {s['verdict']}, want fail)"))
        ok &= caught
    sys.exit(0 if ok else 1)
    PY

# The RDMA scenarios. Default: inside a soft-RoCE VM (hosts/rxe-vm.yaml); on a host with RDMA, pass a profile that has it.
test-rdma hosts="hosts/rxe-vm.yaml" *args="": build-deps
    if grep -q '^kind: rxe-vm' {{hosts}}; then just setup-rxe; fi
    cargo run --release -q -p wringer --bin wringer -- run --hosts {{hosts}} --filter rdma {{args}}

# The cross-host scenarios (`--filter xhost`: named so, or `requires: [xhost]`) against an inventory over SSH (default: three local container hosts; where the kernel has no RDMA device, the RDMA pair runs between two soft-RoCE VMs, the containers profile's `rdma_vm:`, with the faults on the RoCE wire).
test-xhost hosts="hosts/containers.yaml" *args="": build-deps (apt "openssh-client") external rxe-if-needed
    #!/usr/bin/env bash
    set -uo pipefail
    if grep -q '^kind: containers' {{hosts}}; then just setup-containers || exit 1; fi
    w=$(bash scripts/wringer-bin.sh) || exit 2
    "$w" run --hosts {{hosts}} --filter xhost {{args}}

# Our transport and coordinator against sockperf and iperf3, alternating in rounds (median ratio with its spread in reports/bench/; --quick for CI), then the criterion benches.
bench *args="": build-deps (apt "sockperf" "iperf3")
    cargo run --release -q -p wringer --bin wringer -- bench --out reports/bench {{args}}
    cargo bench -p wringer-transport --bench frame --bench tcp

# The bench twice in a row, the second against the first: how far each median ratio moves (the method promises under 15% on every TCP row).
bench-twice *args="": build-deps (apt "sockperf" "iperf3")
    cargo run --release -q -p wringer --bin wringer -- bench --out reports/bench-1 {{args}}
    cargo run --release -q -p wringer --bin wringer -- bench --out reports/bench-2 --against reports/bench-1/bench.json {{args}}

# Launchers compared: start 8, 32 and 64 ranks over three hosts and finish the rendezvous, through srun on the Slurm test cluster against the SSH fan-out to the container hosts (alternating rounds; reports/bench-launch/).
bench-launch *args="": build-deps setup-slurm setup-containers
    cargo run --release -q -p wringer --bin wringer -- bench --launch-slurm hosts/slurm-containers.yaml --launch-ssh hosts/containers.yaml --ranks 8,32,64 --out reports/bench-launch {{args}}

# What the lifecycle audit costs: whole audited scenarios with the eBPF and the strace recorder, each against the same scenario unaudited, in alternating rounds; then the recorder's and the checker's time per trace (criterion: rendering, typed events written and read, a check from typed events or from text).
bench-audit hosts="hosts/local.yaml" *args="": build-deps (apt "strace")
    cargo run --release -q -p wringer --bin wringer -- bench --audit-cost {{hosts}} --out reports/bench-audit {{args}}
    cargo bench -p wringer --all-features --bench audit_trace

# The transport's concurrency under a model checker (shuttle, PCT schedules): the read path with one and two callers, a reset read once, and teardown against callers in recv and send, 1,000 schedules each; every concurrency bug switch makes a model fail, and the schedule it wrote fails again on replay (transport/tests/model.rs, docs/model-check.md).
model-check:
    #!/usr/bin/env bash
    set -euo pipefail
    export RUSTFLAGS="--cfg wringer_model" CARGO_TARGET_DIR=target/model
    cargo clippy -q -p wringer-transport --features bug-injection --test model -- -D warnings
    mkdir -p target/model
    start=$(date +%s)
    cargo test -q -p wringer-transport --features bug-injection --release --test model -- --test-threads=1 --nocapture > target/model/model-check.log 2>&1 || { tail -80 target/model/model-check.log; exit 1; }
    grep -E "^model .*explored|caught by model|^test result" target/model/model-check.log
    echo "model-check: $(( $(date +%s) - start )) s (build included; log: target/model/model-check.log)"

# wringer audit beside Helgrind and ThreadSanitizer on the waits and happens-before fixtures (each broken one and its twin): who flags what, and the wall times (target/race-tools.md).
race-tools: build-deps (apt "valgrind" "clang")
    cargo build --release -q -p wringer
    bash scripts/race-tools.sh target/race-tools.md

# The RDMA rows of the bench (ours vs ib_send_lat and ib_write_bw, same VM, same sizes), inside a soft-RoCE VM.
bench-rdma: build-deps setup-rxe
    #!/usr/bin/env bash
    set -euo pipefail
    cargo build --release -q -p wringer
    out="$PWD/reports/bench-rdma"
    mkdir -p "$out"
    printf '%s\n' 'modprobe rdma_rxe' 'ip link add wrx0a type veth peer name wrx0b' 'ip link set wrx0a up' 'ip link set wrx0b up' \
        'ip addr add 10.213.0.1/24 dev wrx0a' 'rdma link add rxe0 type rxe netdev wrx0a' \
        "cd $PWD && CI=true ./target/release/wringer bench --rdma-only --out $out > $out/bench.log 2>&1" > "$out/run.sh"
    timeout 900 vng --disable-kvm --run /opt/wringer-vm/boot/vmlinuz-6.1.0-56-amd64 --memory 2G --cpus 2 --rwdir "$out" --exec "sh $out/run.sh" > "$out/console.log" 2>&1 || true
    cat "$out/bench.md"

# Stripped binaries for a GPU host without Rust, in target/gpu-check (about 15 MiB): carry that folder, then run scripts/gpu-check.sh there.
gpu-bundle: build-deps
    #!/usr/bin/env bash
    set -euo pipefail
    cargo build --release -q -p wringer
    mkdir -p target/gpu-check/tests
    strip -o target/gpu-check/wringer target/release/wringer
    cargo test --release -q -p wringer-transport --features gpu,rdma --test gpu --no-run --message-format=json \
        | python3 -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable")]' \
        | while read -r t; do strip -o target/gpu-check/tests/transport-gpu "$t"; done
    ls -la target/gpu-check target/gpu-check/tests

# Mutation testing of the transport's lifecycle modules (cargo-mutants), writes mutants.out/: every mutant against the transport's own tests, then the ones they let through against the loopback TCP scenarios and the audit's bug-switch tests as well.
mutants *args="": build-deps (apt "strace")
    command -v cargo-mutants >/dev/null || cargo install cargo-mutants --locked
    cargo mutants --test-tool nextest --package wringer-transport --test-package wringer-transport --features wringer-transport/bug-injection \
        {{mutated}} --timeout 90 -j 2 --output mutants.out {{args}} || true
    cargo mutants --iterate --baseline skip --test-tool nextest --package wringer-transport --test-package wringer-transport --test-package wringer \
        --features wringer/bug-injection {{mutated}} --timeout 900 --output mutants.out {{args}} \
        -- --run-ignored all -E 'package(transport) | binary(tcp_scenarios) | binary(audit) | binary(blind_spots)'
    # (nextest: the fd and thread counting tests need a process of their own.)

mutated := "--file transport/src/conn.rs --file transport/src/listener.rs --file transport/src/connect.rs --file transport/src/handshake.rs --file transport/src/frame.rs --file transport/src/stream.rs"

# Fuzz the frame decoder, the scenario and host-profile parsers and the rank messages the coordinator reads (not part of CI). cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP lets the stable toolchain accept them. `runs` caps executions per target.
fuzz seconds="60" runs="10000000":
    command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
    cd transport/fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run frame_decoder -- -max_total_time={{seconds}} -runs={{runs}}
    cd harness/fuzz && for t in scenario_parser profile_parser rank_messages; do RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none $t -- -max_total_time={{seconds}} -runs={{runs}} || exit 1; done

# The bug-injection build (transport bugs switched on by WRINGER_TRANSPORT_BUG) as target/bug-injection/release/wringer. Built in the shared target folder, so only the two crates whose features change are compiled again (a folder of its own rebuilt every dependency); the plain binary is put back after.
[private]
bug-injection-build:
    cargo build --release -q -p wringer --features wringer/bug-injection
    mkdir -p target/bug-injection/release
    cp target/release/wringer target/bug-injection/release/wringer
    # Where a build tree's binary finds the exec steps' programs (`just external`): beside it.
    ln -sfn ../external target/bug-injection/external
    cargo build --release -q -p wringer

# What the build needs beyond Rust: the RDMA binding (sideway) builds a small rdma-core shim with cmake and bindgen (libclang).
[private]
build-deps: (apt "cmake" "clang" "libibverbs-dev" "librdmacm-dev")

ptxas := "target/cuda-tools/nvidia/cuda_nvcc/bin/ptxas"

# NVIDIA's PTX assembler (from PyPI, no GPU or driver needed), so the tests assemble the GPU kernels for sm_70/80/90.
[private]
cuda-tools:
    [ -x {{ptxas}} ] || pip install --quiet --no-deps --target target/cuda-tools "nvidia-cuda-nvcc-cu12==12.9.86"
    chmod +x {{ptxas}}

# Debian's ROCm 5.2 HIP runtime, hiprtc (in libamdhip64, with its builtins) and comgr with the device libraries, so the tests load HIP and compile the AMD kernels with no GPU.
[private]
hip-tools: (apt "libamdhip64-5" "libhiprtc-builtins5" "libamd-comgr2" "rocm-device-libs")

# Install the Debian packages among these that are missing (as root, or through sudo).
[private]
apt +packages:
    #!/usr/bin/env bash
    set -euo pipefail
    missing=()
    for p in {{packages}}; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && exit 0
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    # One install at a time (CI prepares several stages at once; setup-rxe takes the same lock).
    # -o: a daemon a package starts does not inherit the lock.
    $sudo flock -o /tmp/wringer-apt.lock sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"' apt "${missing[@]}"
