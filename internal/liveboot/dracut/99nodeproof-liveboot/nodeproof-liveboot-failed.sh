#!/bin/sh
# dracut's shutdown-emergency hook (rd.shell=0): the boot failed; say on the
# console what Ignition's and nodeproof's units logged (Ignition logs to the
# journal only), for the host to read.
echo "nodeproof-liveboot: boot failed; the journal of Ignition and nodeproof:"
journalctl -b --no-pager -o short-monotonic -u ignition-fetch-offline.service -u ignition-fetch.service -u nodeproof-agent.service \
    -u ignition-kargs.service -u ignition-disks.service -u ignition-mount.service -u ignition-files.service -u nodeproof-kubelet-key.service \
    2>&1 | grep -v '^-- ' | tail -n 60 | sed 's/^/nodeproof-liveboot: journal: /'
