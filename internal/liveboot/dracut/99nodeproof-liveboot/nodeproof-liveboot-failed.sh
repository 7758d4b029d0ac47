#!/bin/sh
# dracut's shutdown-emergency hook (rd.shell=0): the boot failed; say on the
# console what went wrong, for the host to read: the warnings and errors of
# Ignition's stages (Ignition logs to the journal only; its info lines
# include the whole config) and everything nodeproof's units logged.
echo "nodeproof-liveboot: boot failed; the journal of Ignition's stages (warnings and errors) and nodeproof's units:"
{
    journalctl -b --no-pager -o short-monotonic -p warning -u ignition-fetch-offline.service -u ignition-fetch.service \
        -u ignition-kargs.service -u ignition-disks.service -u ignition-mount.service -u ignition-files.service
    journalctl -b --no-pager -o short-monotonic -u nodeproof-agent.service -u nodeproof-kubelet-key.service
} 2>&1 | grep -v '^-- ' | tail -n 60 | sed 's/^/nodeproof-liveboot: journal: /'
