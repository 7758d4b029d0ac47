#!/bin/bash
# -*- mode: shell-script; indent-tabs-mode: nil; sh-basic-offset: 4; -*-
# ex: ts=8 sw=4 sts=4 et filetype=sh
#
# dracut module "nodeproof": nodeproof-agent in pointer mode, in the
# initramfs, before Ignition's fetch stage (see deploy/node/README.md).
#
#   dracut --add nodeproof ...
#
# Takes from the machine that builds the initramfs:
#   the agent          $moddir/nodeproof-agent if present, else
#                      $NODEPROOF_AGENT_BINARY (default /usr/bin/nodeproof-agent)
#   the CA bundle      $NODEPROOF_CONFIG_DIR/mcs-ca-bundle.crt (the MCS's CA)
#   the settings       $NODEPROOF_CONFIG_DIR/agent.env (NODEPROOF_SERVER,
#                      NODEPROOF_POOL, NODEPROOF_EVIDENCE)
# ($NODEPROOF_CONFIG_DIR: default /etc/nodeproof), installed in the initramfs
# as /usr/bin/nodeproof-agent and /etc/nodeproof/{mcs-ca-bundle.crt,agent.env}.
# A missing one fails the build: an initramfs that cannot attest would stop
# every first boot.

check() {
    # Only when asked for: dracut --add nodeproof (or add_dracutmodules+=).
    return 255
}

depends() {
    echo ignition network
}

install() {
    local agent="$moddir/nodeproof-agent"
    [[ -x $agent ]] || agent=${NODEPROOF_AGENT_BINARY:-/usr/bin/nodeproof-agent}
    local conf=${NODEPROOF_CONFIG_DIR:-/etc/nodeproof}
    local f
    for f in "$agent" "$conf/mcs-ca-bundle.crt" "$conf/agent.env"; do
        if [[ ! -f $f ]]; then
            dfatal "nodeproof: $f is missing (see deploy/node/README.md)"
            exit 1
        fi
    done
    for f in NODEPROOF_SERVER NODEPROOF_POOL NODEPROOF_EVIDENCE; do
        if ! grep -q "^$f=." "$conf/agent.env"; then
            dfatal "nodeproof: $conf/agent.env sets no $f"
            exit 1
        fi
    done

    inst_binary "$agent" /usr/bin/nodeproof-agent
    inst_simple "$conf/mcs-ca-bundle.crt" /etc/nodeproof/mcs-ca-bundle.crt
    inst_simple "$conf/agent.env" /etc/nodeproof/agent.env

    inst_multiple cp chmod dirname mkdir mv sed sync
    inst_multiple -o setfiles
    inst_script "$moddir/nodeproof-persist-kubelet-key.sh" /usr/libexec/nodeproof-persist-kubelet-key

    inst_simple "$moddir/nodeproof-agent.service" "$systemdsystemunitdir/nodeproof-agent.service"
    inst_simple "$moddir/nodeproof-kubelet-key.service" "$systemdsystemunitdir/nodeproof-kubelet-key.service"
    inst_simple "$moddir/ignition-fetch-nodeproof.conf" "$systemdsystemunitdir/ignition-fetch.service.d/10-nodeproof.conf"

    # First boot only, like Ignition's stages (ignition-complete.target is
    # queued only with ignition.firstboot). `|| exit 1`: fail the build if a
    # unit is missing, as Ignition's module does.
    $SYSTEMCTL -q --root="$initdir" add-requires ignition-complete.target nodeproof-agent.service || exit 1
    $SYSTEMCTL -q --root="$initdir" add-requires ignition-complete.target nodeproof-kubelet-key.service || exit 1
}

installkernel() {
    # The TPM, where the kernel has its drivers as modules (/dev/tpmrm0).
    instmods tpm_crb tpm_tis
}
