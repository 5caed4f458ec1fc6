#!/usr/bin/env bash
# Make this machine able to run the rxe-vm host profile: qemu, rdma-core and perftest (used
# inside the VM, which sees this machine's filesystem read-only), virtme-ng, and a Debian
# kernel that has rdma_rxe, unpacked with its modules where vng finds them. Idempotent.
set -euo pipefail
kver="${WRINGER_VM_KERNEL:-6.1.0-56-amd64}"
dest="${WRINGER_VM_DIR:-/opt/wringer-vm}"
sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo

# qemu-utils: where a newer qemu-utils came preinstalled from outside Debian's archive,
# installing qemu-system-x86 removes it; listing it keeps qemu-img on the machine.
# openssh-server: sshd runs inside the rxe-vm-pair VMs (from this machine's files). Installed
# with service starts denied, so no sshd starts on this machine.
pkgs=(qemu-system-x86 qemu-utils rdma-core ibverbs-utils perftest rdmacm-utils busybox-static kmod iproute2 openssh-server openssh-client)
missing() { local p; for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done; }
mapfile -t need < <(missing)
if [ ${#need[@]} -gt 0 ]; then
    # One install at a time (the `apt` recipe takes the same lock); services are denied a
    # start below, so no daemon keeps the lock's descriptor.
    exec 9>/tmp/wringer-apt.lock
    flock 9
    $sudo apt-get update -qq
    deny=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
        $sudo chmod +x /usr/sbin/policy-rc.d
        deny=1
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
    # A second pass: installing one package can remove another (qemu-utils, above).
    mapfile -t need < <(missing)
    if [ ${#need[@]} -gt 0 ]; then DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"; fi
    if [ -n "$deny" ]; then $sudo rm -f /usr/sbin/policy-rc.d; fi
    exec 9>&-
fi
if ! command -v vng >/dev/null; then
    pip install --quiet virtme-ng
    # pyenv installs console scripts behind shims that exist only after a rehash.
    if command -v pyenv >/dev/null; then pyenv rehash; fi
    command -v vng >/dev/null || { echo "setup-rxe: virtme-ng installed but vng is not on PATH" >&2; exit 1; }
fi

if [ ! -f "$dest/boot/vmlinuz-$kver" ]; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    (cd "$tmp" && apt-get download "linux-image-$kver")
    $sudo mkdir -p "$dest"
    $sudo dpkg -x "$tmp"/linux-image-"$kver"_*.deb "$dest"
fi
if [ ! -d "/lib/modules/$kver" ]; then
    # /lib/modules may not exist yet (containers, minimal images): without it cp would copy the
    # kernel's folder AS /lib/modules.
    $sudo mkdir -p /lib/modules
    $sudo cp -a "$dest/lib/modules/$kver" /lib/modules/
    $sudo depmod "$kver"
fi
echo "rxe-vm ready: kernel $dest/boot/vmlinuz-$kver"
