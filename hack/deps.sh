#!/usr/bin/env bash
# Installs what nodeproof's tests and demo need on a fresh Debian machine:
# swtpm (software TPM) and its setup tools, tpm2-tools (the second evidence
# producer), gcc and libssl-dev (the go-tpm-tools simulator is cgo), and
# libblkid-dev (the real Ignition client built by hack/tools.sh is cgo),
# sslscan (the TLS scanner the TLS tests run against the server), haproxy
# (the PROXY protocol tests put it in front of the server), skopeo and podman
# (the image test reads and loads make image's archive), and jq,
# curl and openssl (deploy/examples/tpm2-tools-attest.sh, which a test runs),
# and what the live boot test (internal/liveboot, make test-boot) boots a VM
# with: qemu-system-x86 and ovmf (UEFI firmware with Secure Boot), mtools,
# dosfstools and fdisk (the ESP disk image, no loop mounts), busybox-static
# (the guest's initramfs), sbsigntool and efitools (the signer tests'
# own Secure Boot keys: images re-signed, variable updates signed),
# binutils (objcopy builds the unified kernel images), and dracut-core and
# dracut-network (the dracut + systemd initramfs of TestLiveBootDracut;
# they install beside systemd, removing nothing), and systemd's
# systemd-pcrphase with tpm2-tss's swtpm TCTI (attest/tpm's check of the boot
# phases systemd measures).
# Idempotent: does nothing when everything is there.
set -euo pipefail

need=()
for bin in swtpm swtpm_setup swtpm_localca:swtpm-tools tpm2_quote:tpm2-tools gcc sslscan haproxy skopeo podman jq curl openssl \
  qemu-system-x86_64:qemu-system-x86 mcopy:mtools mkfs.vfat:dosfstools sfdisk:fdisk \
  sbsign:sbsigntool sbattach:sbsigntool sbverify:sbsigntool cert-to-efi-sig-list:efitools sign-efi-sig-list:efitools \
  objcopy:binutils; do
  cmd=${bin%%:*}
  pkg=${bin#*:}
  [ "$pkg" = "$bin" ] && pkg=$cmd
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/bin/$cmd" ] || [ -x "/usr/sbin/$cmd" ] || need+=("$pkg")
done
[ -f /usr/include/openssl/evp.h ] || need+=(libssl-dev)
# The real Ignition client (hack/tools.sh) is cgo and links libblkid.
[ -f /usr/include/blkid/blkid.h ] || need+=(libblkid-dev)
# The live boot: OVMF's Secure Boot firmware and its Microsoft-keyed
# variables, and a statically linked busybox for the initramfs.
[ -f /usr/share/OVMF/OVMF_CODE_4M.secboot.fd ] && [ -f /usr/share/OVMF/OVMF_VARS_4M.ms.fd ] || need+=(ovmf)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed' || need+=(busybox-static)
# The dracut initramfs: dracut 059 and its network modules (systemd-networkd,
# url-lib), which Ignition's and nodeproof's dracut modules depend on.
[ -x /usr/bin/dracut ] || need+=(dracut-core)
[ -d /usr/lib/dracut/modules.d/45url-lib ] || need+=(dracut-network)
# dracut copies the initramfs's systemd, udev and systemd-networkd from
# this machine.
[ -x /lib/systemd/systemd ] || need+=(systemd)
[ -x /lib/systemd/systemd-networkd ] || need+=(systemd)
[ -x /bin/udevadm ] || need+=(udev)
# attest/tpm runs Debian's systemd-pcrphase against swtpm (the boot phases
# systemd extends into PCR 11), through tpm2-tss's swtpm TCTI, in a mount
# namespace of its own (unshare, util-linux).
[ -x /lib/systemd/systemd-pcrphase ] || need+=(systemd)
ls /usr/lib/*/libtss2-tcti-swtpm.so.0 >/dev/null 2>&1 || need+=(libtss2-tcti-swtpm0)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
# swtpm_setup and swtpm_localca both come with swtpm-tools.
mapfile -t pkgs < <(printf '%s\n' "${need[@]}" | sed 's/^swtpm_setup$/swtpm-tools/' | sort -u)
echo "installing: ${pkgs[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "need root (or sudo) to apt-get install ${pkgs[*]}" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
