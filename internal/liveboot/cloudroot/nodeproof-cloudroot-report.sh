#!/bin/bash
# Says what systemd recorded of the agent's first-boot unit and the units
# ordered after it, and what is under the first-boot files' directories
# (path, mode, SHA-256), in lines for the host to read, each with the
# guest's uptime; saves those files to the data disk (/dev/vdb) as a tar
# archive; powers off.
set -u
mark() { echo "nodeproof-cloudroot: $* [uptime $(cut -d' ' -f1 /proc/uptime)]"; }
mark "real root up: $(. /etc/os-release; echo "$PRETTY_NAME"), not an initramfs: $([ -e /etc/initrd-release ] && echo no || echo yes)"
for u in nodeproof-agent-firstboot kubelet machine-config-daemon-firstboot systemd-networkd; do
    mark "unit $u.service $(systemctl show -p ActiveState -p Result -p ExecMainStatus -p ExecMainStartTimestampMonotonic -p ExecMainExitTimestampMonotonic -p InactiveExitTimestampMonotonic "$u.service" | sort | tr '\n' ' ')"
done
dirs=()
for d in etc/kubernetes etc/nodeproof etc/machine-config-daemon var/lib/kubelet usr/local/bin etc/systemd/system etc/systemd/system-preset; do
    [ -d "/$d" ] && dirs+=("$d")
done
for f in /etc/mcs-machine-config-content.json /etc/ignition-machine-config-encapsulated.json; do
    [ -f "$f" ] && dirs+=("${f#/}")
done
cd / || exit 1
find "${dirs[@]}" -type f | sort | while read -r f; do
    mark "file /$f mode $(stat -c %a "$f") sha256 $(sha256sum <"$f" | cut -d' ' -f1)"
done
journalctl -b --no-pager -o cat -u nodeproof-agent-firstboot.service | tail -n 30 | sed 's/^/nodeproof-cloudroot: journal: /'
# The node's re-attestation, which its timer starts 30 s after every boot
# (this boot powers off sooner): started now, once the first boot's unit
# has run (its conditions skip it otherwise).
if systemctl cat nodeproof-reattest.service >/dev/null 2>&1; then
    systemctl start nodeproof-reattest.service
    mark "unit nodeproof-reattest.service $(systemctl show -p ActiveState -p Result -p ExecMainStatus -p ExecMainStartTimestampMonotonic -p ExecMainExitTimestampMonotonic -p InactiveExitTimestampMonotonic nodeproof-reattest.service | sort | tr '\n' ' ')"
    journalctl -b --no-pager -o cat -u nodeproof-reattest.service | tail -n 10 | sed 's/^/nodeproof-cloudroot: reattest journal: /'
fi
tar -cf /dev/vdb --exclude=usr/local/bin "${dirs[@]}" && sync
mark "poweroff"
systemctl --no-block poweroff
