#!/bin/bash
# The installed system's skeleton in the empty /sysroot (root=tmpfs): the
# accounts an RHCOS or Fedora CoreOS image ships (root, and core, whom
# machine configs give SSH keys), so that Ignition's files stage finds what
# it modifies (useradd/usermod --root /sysroot lock /sysroot/etc/passwd).
set -eu
umask 022
mkdir -p /sysroot/etc /sysroot/root /sysroot/var/home/core
printf '%s\n' 'root:x:0:0:root:/root:/bin/bash' 'core:x:1000:1000:CoreOS Admin:/var/home/core:/bin/bash' >/sysroot/etc/passwd
printf '%s\n' 'root:x:0:' 'wheel:x:10:core' 'core:x:1000:' >/sysroot/etc/group
printf '%s\n' 'root:*:19000:0:99999:7:::' 'core:*:19000:0:99999:7:::' >/sysroot/etc/shadow
printf '%s\n' 'root:*::' 'wheel:*::core' 'core:!::' >/sysroot/etc/gshadow
chmod 0000 /sysroot/etc/shadow /sysroot/etc/gshadow
chown 1000:1000 /sysroot/var/home/core
chmod 0700 /sysroot/root /sysroot/var/home/core
echo "nodeproof-liveboot: installed system's skeleton in /sysroot (root, core)"
