#!/bin/bash
# Says when each of Ignition's and nodeproof's units ran and what Ignition
# wrote under /sysroot (path, mode, SHA-256), in lines for the host to read,
# each with the guest's uptime; saves /sysroot to the data disk as a tar
# archive; powers off.
set -u
mark() { echo "nodeproof-liveboot: $* [uptime $(cut -d' ' -f1 /proc/uptime)]"; }
mark "ignition complete"
# Each stage's start and exit (CLOCK_MONOTONIC, µs) as systemd recorded
# them: the host checks their order (systemd-pcrphase-initrd runs only in
# a unified kernel image's initrd: systemd-stub's variable says so).
for u in systemd-pcrphase-initrd ignition-fetch-offline ignition-fetch nodeproof-agent ignition-kargs ignition-disks ignition-mount ignition-files nodeproof-kubelet-key; do
    mark "unit $u.service $(systemctl show -p Result -p ExecMainStatus -p ExecMainStartTimestampMonotonic -p ExecMainExitTimestampMonotonic "$u.service" | sort | tr '\n' ' ')"
done
cd /sysroot || exit 1
find . -type f | sort | while read -r f; do
    mark "sysroot ${f#.} mode $(stat -c %a "$f") sha256 $(sha256sum <"$f" | cut -d' ' -f1)"
done
tar -cf /dev/vdb -C /sysroot . && sync
mark "poweroff"
systemctl --no-block --force poweroff
