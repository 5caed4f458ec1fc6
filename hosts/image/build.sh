#!/usr/bin/env bash
# Build a container test-host image locally (no registry): a minimal Debian with sshd, tc, strace,
# ps, the runtime of the real Gloo and Debian's python3 (exec scenarios: the torch venvs made with
# the same interpreter are bind-mounted in), imported into Docker.
#   build.sh [IMAGE] [SUITE] [EXTRA_PACKAGES]
# wringer-host:bookworm is the plain host; wringer-slurm:SUITE adds Debian's Slurm and munge
# (`just setup-slurm`), from this machine's release, because the Slurm clients here must speak
# the daemons' release. Idempotent: does nothing when an image of this recipe's version exists.
set -euo pipefail
image="${1:-wringer-host:bookworm}"
suite="${2:-bookworm}"
extra="${3:-}"
# Raise when the image's contents change, so an older image is rebuilt.
version="3${extra:+-$extra}"
have="$(docker image inspect -f '{{ index .Config.Labels "wringer.image" }}' "$image" 2>/dev/null || true)"
if [ "$have" = "$version" ]; then
    echo "$image (version $version) already exists"
    exit 0
fi
root="$(mktemp -d /tmp/wringer-rootfs.XXXXXX)"
# The new root is its own /: mode 700 from mktemp would lock every other user out of it.
chmod 755 "$root"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=openssh-server,iproute2,procps,ca-certificates,strace,libgloo0,coreutils,python3 \
    "$suite" "$root" http://deb.debian.org/debian
if [ -n "$extra" ]; then
    # A second stage, with apt in the new root: debootstrap's own ordering cannot configure
    # packages whose scripts need a working base (munge's does). No daemon may start here.
    printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
    chmod 755 "$root/usr/sbin/policy-rc.d"
    mount -t proc proc "$root/proc"
    trap 'umount "$root/proc" 2>/dev/null || true; rm -rf "$root"' EXIT
    chroot "$root" apt-get update -q
    DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -q --no-install-recommends ${extra//,/ }
    umount "$root/proc"
    rm -f "$root/usr/sbin/policy-rc.d"
fi
# sshd: keys only, root allowed (the container is a throwaway test host), no DNS lookups.
mkdir -p "$root/run/sshd" "$root/root/.ssh"
chmod 700 "$root/root/.ssh"
cat > "$root/etc/ssh/sshd_config.d/wringer.conf" <<'CONF'
PermitRootLogin prohibit-password
PasswordAuthentication no
UseDNS no
MaxStartups 100:30:200
MaxSessions 100
CONF
# Host keys are made at first start, so every container gets its own.
rm -f "$root"/etc/ssh/ssh_host_*
cat > "$root/usr/local/sbin/wringer-host" <<'INIT'
#!/bin/sh
# Entrypoint: install the authorized key passed in the environment, then run sshd in front.
set -e
ssh-keygen -A >/dev/null
printf '%s\n' "$WRINGER_AUTHORIZED_KEY" > /root/.ssh/authorized_keys
chmod 600 /root/.ssh/authorized_keys
exec /usr/sbin/sshd -D -e
INIT
chmod 755 "$root/usr/local/sbin/wringer-host"
# A key or configuration a package made is not the run's: each run writes its own.
rm -f "$root"/etc/munge/munge.key
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import -c 'CMD ["/usr/local/sbin/wringer-host"]' -c 'EXPOSE 22' \
    -c "LABEL wringer.image=$version" - "$image"
echo "built $image"
