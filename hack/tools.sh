#!/usr/bin/env bash
# Builds the real parts nodeproof's tests run against, from the Go module
# mirror, and caches them by version so that only the first run pays:
#
#   ignition        the real Ignition client (cgo, libblkid)
#   kube-apiserver  from the nested tool module hack/tools/kube/
#   kubectl         from the same module (deploy/'s server-side dry run)
#   kube-controller-manager  from the same module (the live boot's CSR
#                   signer)
#   kubelet         from the same module, statically linked (CGO_ENABLED=0:
#                   it runs in the live boot's busybox initramfs, which has
#                   no C library)
#   etcd            from the nested tool module hack/tools/etcd/
#   controller-gen  from the nested tool module hack/tools/controller-gen/
#                   (`make generate`, and the store's CRD drift test)
#   boot-chain      Debian's signed shim, GRUB and kernel (the ABI
#                   linux-image-amd64 depends on today), systemd-stub
#                   (systemd-boot-efi: unified kernel images) and the guest's
#                   kernel modules, for the live boot (make test-boot):
#                   apt-get download and unpacked, never installed, into
#                   boot/<abi>_<versions>/ with boot/current pointing at it;
#                   and the signed kernel of the ABI before it (same key,
#                   another version: the signer tests' second kernel), in
#                   boot/previous-kernel; and Debian's containerd (the
#                   first boot's kubelet's container runtime), in
#                   runtime/ (hack/bootchain; ~170 MB downloaded, ~50 s)
#
# Measured on a fresh 2-core machine, with other work beside it (module
# downloads included): ignition 76 s, kube-apiserver 218 s, kubectl 70 s and
# etcd 34 s after it (they share its build cache), controller-gen 62 s —
# 8 minutes in all. A slower or busier machine took 20 (kube-apiserver 12).
# kube-controller-manager then took 499 s and the kubelet 586 s (81 MB,
# static) on the same machine busy with other builds and boots (load ~12).
# Every build says every 30 s that it is still going.
#
# Layout: ${NODEPROOF_CACHE:-$HOME/.cache/nodeproof}/bin/<name>-<version>/<name>,
# plus bin/kubebuilder-assets-<kube version>/ with symlinks to kube-apiserver and
# etcd (envtest's KUBEBUILDER_ASSETS). internal/testenv finds them there.
#
# Usage: hack/tools.sh [ignition|kube-apiserver|kubectl|kube-controller-manager|kubelet|etcd|controller-gen|boot-chain ...]   (default: all)
# Build flags are fixed on purpose: changing them (e.g. adding -trimpath)
# invalidates Go's build cache for the whole kube-apiserver graph.
set -euo pipefail

IGNITION_VERSION=v2.24.0
KUBE_VERSION=v1.34.4 # keep in step with hack/tools/kube/go.mod
ETCD_VERSION=v3.6.4  # keep in step with hack/tools/etcd/go.mod
CONTROLLER_TOOLS_VERSION=v0.19.0 # keep in step with hack/tools/controller-gen/go.mod

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${NODEPROOF_CACHE:-$HOME/.cache/nodeproof}
bin=$cache/bin
mkdir -p "$bin"

# Builds never see a go.work of the caller (the tool modules' go.sum decides).
export GOWORK=off

# Two `make test` at once must not build the same thing twice.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$bin/.tools.lock"
  flock 9
fi

human_size() { du -h --apparent-size "$1" | cut -f1; }

# go build prints nothing until it is done: with_progress says every 30 s
# that a build is still going.
# shellcheck source=lib/progress.sh
. "$root/hack/lib/progress.sh"

# ensure NAME VERSION BUILD_FUNCTION: runs BUILD_FUNCTION TMPDIR (which must
# leave the binary at TMPDIR/NAME) unless bin/NAME-VERSION/NAME exists, then
# moves the binary into place atomically.
ensure() {
  local name=$1 version=$2 build=$3
  local dir=$bin/$name-$version
  if [ -x "$dir/$name" ]; then
    echo "$name $version: cached ($dir/$name)"
    return 0
  fi
  echo "$name $version: building (first run takes minutes)…"
  mkdir -p "$dir"
  local tmp
  tmp=$(mktemp -d "$dir/.build.XXXXXX")
  local start=$SECONDS
  if ! with_progress "building $name $version" "$build" "$tmp"; then
    rm -rf "$tmp"
    echo "$name $version: build FAILED" >&2
    return 1
  fi
  chmod 0755 "$tmp/$name"
  mv -f "$tmp/$name" "$dir/$name"
  rm -rf "$tmp"
  echo "$name $version: built in $((SECONDS - start))s, $(human_size "$dir/$name") ($dir/$name)"
}

build_ignition() {
  local out=$1
  [ -f /usr/include/blkid/blkid.h ] || {
    echo "ignition needs libblkid-dev (run: make deps)" >&2
    return 1
  }
  # `go install pkg@version` builds outside any module, exactly as released.
  # The main package lives in .../internal, so the binary is named `internal`.
  # selinuxRelabel=false: the files stage must not try to relabel under -root.
  GOBIN=$out CGO_ENABLED=1 go install \
    -ldflags "-X github.com/coreos/ignition/v2/internal/version.Raw=$IGNITION_VERSION -X github.com/coreos/ignition/v2/internal/distro.selinuxRelabel=false" \
    "github.com/coreos/ignition/v2/internal@$IGNITION_VERSION"
  mv "$out/internal" "$out/ignition"
}

build_kube_apiserver() {
  local out=$1
  (
    cd "$root/hack/tools/kube"
    go build \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34" \
      -o "$out/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
  )
}

# Same module, same -ldflags as kube-apiserver, so both share the build cache
# of the packages they have in common.
build_kubectl() {
  local out=$1
  (
    cd "$root/hack/tools/kube"
    go build \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34" \
      -o "$out/kubectl" k8s.io/kubernetes/cmd/kubectl
  )
}

# Same module, same -ldflags: shares the build cache with kube-apiserver.
build_kube_controller_manager() {
  local out=$1
  (
    cd "$root/hack/tools/kube"
    go build \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34" \
      -o "$out/kube-controller-manager" k8s.io/kubernetes/cmd/kube-controller-manager
  )
}

# Same module, same -ldflags, but CGO_ENABLED=0: the live boot copies the
# kubelet into a busybox initramfs that has no C library (upstream links it
# dynamically). Without cgo the packages that differ (net, os/user and what
# depends on them) are compiled once more, in a build cache of their own.
build_kubelet() {
  local out=$1
  (
    cd "$root/hack/tools/kube"
    CGO_ENABLED=0 go build \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34" \
      -o "$out/kubelet" k8s.io/kubernetes/cmd/kubelet
  )
}

build_etcd() {
  local out=$1
  (
    cd "$root/hack/tools/etcd"
    # The module root of go.etcd.io/etcd/server/v3 is etcd's main package.
    go build -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3
  )
}

build_controller_gen() {
  local out=$1
  (
    cd "$root/hack/tools/controller-gen"
    go build -ldflags "-s -w" -o "$out/controller-gen" sigs.k8s.io/controller-tools/cmd/controller-gen
  )
}

# kubebuilder-assets-<kube version>: what envtest's BinaryAssetsDirectory /
# KUBEBUILDER_ASSETS expects (files named kube-apiserver and etcd). Relative
# symlinks, so the cache directory can be moved.
assets() {
  local dir=$bin/kubebuilder-assets-$KUBE_VERSION
  mkdir -p "$dir"
  ln -sfn "../kube-apiserver-$KUBE_VERSION/kube-apiserver" "$dir/kube-apiserver"
  ln -sfn "../etcd-$ETCD_VERSION/etcd" "$dir/etcd"
}

# boot_chain: hack/bootchain keeps what it fetched by ABI and package
# versions, and says "cached" when they have not moved.
boot_chain() {
  # In a condition, as ensure() calls it: with_progress's wait for its
  # ticker returns the ticker's TERM status, which set -e must not see.
  if ! (cd "$root" && with_progress "fetching the boot chain" go run ./hack/bootchain); then
    echo "boot chain: fetch FAILED" >&2
    return 1
  fi
}

want=("$@")
[ ${#want[@]} -gt 0 ] || want=(ignition kube-apiserver kubectl kube-controller-manager kubelet etcd controller-gen boot-chain)
for t in "${want[@]}"; do
  case $t in
  ignition) ensure ignition "$IGNITION_VERSION" build_ignition ;;
  kube-apiserver) ensure kube-apiserver "$KUBE_VERSION" build_kube_apiserver ;;
  kubectl) ensure kubectl "$KUBE_VERSION" build_kubectl ;;
  kube-controller-manager) ensure kube-controller-manager "$KUBE_VERSION" build_kube_controller_manager ;;
  kubelet) ensure kubelet "$KUBE_VERSION" build_kubelet ;;
  etcd) ensure etcd "$ETCD_VERSION" build_etcd ;;
  controller-gen) ensure controller-gen "$CONTROLLER_TOOLS_VERSION" build_controller_gen ;;
  boot-chain) boot_chain ;;
  *)
    echo "unknown tool: $t (want ignition, kube-apiserver, kubectl, kube-controller-manager, kubelet, etcd, controller-gen or boot-chain)" >&2
    exit 2
    ;;
  esac
done
assets
