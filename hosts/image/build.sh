#!/usr/bin/env bash
# Build the container test-host image locally (no registry): a minimal Debian with sshd, tc, strace,
# ps and the runtime of the real Gloo (exec scenarios), imported into Docker as
# wringer-host:bookworm. Idempotent: does nothing when an image of this recipe's version exists.
set -euo pipefail
image="${1:-wringer-host:bookworm}"
# Raise when the image's contents change, so an older image is rebuilt.
version=2
have="$(docker image inspect -f '{{ index .Config.Labels "wringer.image" }}' "$image" 2>/dev/null || true)"
if [ "$have" = "$version" ]; then
    echo "$image (version $version) already exists"
    exit 0
fi
root="$(mktemp -d /tmp/wringer-rootfs.XXXXXX)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=openssh-server,iproute2,procps,ca-certificates,strace,libgloo0,coreutils \
    bookworm "$root" http://deb.debian.org/debian
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
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import -c 'CMD ["/usr/local/sbin/wringer-host"]' -c 'EXPOSE 22' \
    -c "LABEL wringer.image=$version" - "$image"
echo "built $image"
