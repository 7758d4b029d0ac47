#!/bin/bash
# dracut module "nodeproof-liveboot": the live boot's end of a first boot in
# the dracut initramfs (internal/liveboot, tests only, never for a real
# image). The initramfs has no installed system to switch to (root=tmpfs;
# nodeproof-liveboot-sysroot.service puts the accounts an RHCOS image has
# into it before Ignition's files stage):
# once Ignition's stages and nodeproof's units are done
# (ignition-complete.target), nodeproof-liveboot-report.service says on the
# console what Ignition wrote under /sysroot, saves /sysroot to the data disk
# (/dev/vdb, a tar archive the host reads back) and powers the machine off.
# A failed boot (emergency; rd.shell=0 rd.emergency=poweroff) prints the
# journal of Ignition's and nodeproof's units on the console first.

check() {
    return 255
}

depends() {
    echo ignition nodeproof
}

install() {
    inst_multiple tar find sort stat sync cut sha256sum tr systemctl journalctl grep tail sed mkdir chmod chown printf
    inst_hook shutdown-emergency 50 "$moddir/nodeproof-liveboot-failed.sh"
    inst_script "$moddir/nodeproof-liveboot-report.sh" /usr/libexec/nodeproof-liveboot-report
    inst_simple "$moddir/nodeproof-liveboot-report.service" "$systemdsystemunitdir/nodeproof-liveboot-report.service"
    inst_script "$moddir/nodeproof-liveboot-sysroot.sh" /usr/libexec/nodeproof-liveboot-sysroot
    inst_simple "$moddir/nodeproof-liveboot-sysroot.service" "$systemdsystemunitdir/nodeproof-liveboot-sysroot.service"
    $SYSTEMCTL -q --root="$initdir" add-wants initrd.target nodeproof-liveboot-report.service || exit 1
    $SYSTEMCTL -q --root="$initdir" add-requires ignition-complete.target nodeproof-liveboot-sysroot.service || exit 1
}
