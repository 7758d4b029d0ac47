#!/bin/bash
# nodeproof-persist-kubelet-key KEY SYSROOT: installs KEY (the kubelet key
# nodeproof-agent made in the initramfs) as
# SYSROOT/var/lib/kubelet/pki/kubelet-client.key.tmp, mode 0600, and gives it
# the SELinux label the installed system's policy wants, as Ignition does for
# the files it writes.
set -euo pipefail

key=$1
sysroot=$2
rel=/var/lib/kubelet/pki/kubelet-client.key.tmp
dst=$sysroot$rel

mkdir -p "$(dirname "$dst")"
chmod 0700 "$(dirname "$dst")"
cp "$key" "$dst.nodeproof"
chmod 0600 "$dst.nodeproof"
sync "$dst.nodeproof" 2>/dev/null || sync
mv -f "$dst.nodeproof" "$dst"

# Label it now when the installed system has an SELinux policy and setfiles
# is here (Ignition's dracut module installs it); else let systemd relabel it
# after switching root (/run/systemd/relabel-extra.d).
if [ -f "$sysroot/etc/selinux/config" ]; then
    policy=$(sed -n 's/^SELINUXTYPE=//p' "$sysroot/etc/selinux/config")
    contexts=$sysroot/etc/selinux/$policy/contexts/files/file_contexts
    if command -v setfiles >/dev/null && [ -n "$policy" ] && [ -f "$contexts" ]; then
        setfiles -F -r "$sysroot" "$contexts" "$sysroot/var/lib/kubelet" "$sysroot/var/lib/kubelet/pki" "$dst"
    else
        mkdir -p /run/systemd/relabel-extra.d
        printf '%s\n' /var/lib/kubelet /var/lib/kubelet/pki "$rel" >/run/systemd/relabel-extra.d/nodeproof.relabel
    fi
fi
echo "nodeproof: kubelet key installed at $rel"
