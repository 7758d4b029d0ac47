// Command bootchain fetches what the live boot (internal/liveboot, make
// test-boot, make demo-boot) boots: Debian's Microsoft-signed shim, its
// signed GRUB and its signed kernel of the ABI linux-image-amd64 depends
// on today, with the kernel modules the guest loads, systemd-stub (the
// unsigned program of unified kernel images), and the signed kernel
// of the ABI before it (the live boot's second kernel signed by the same
// key: internal/liveboot's signer tests), and Debian's containerd (the
// kubelet's container runtime in the first boot). They are downloaded
// with apt-get download and unpacked, never installed, into the cache
// hack/tools.sh builds into ($NODEPROOF_CACHE, default
// ~/.cache/nodeproof), under boot/. hack/tools.sh runs it.
package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/nodeproof/nodeproof/internal/liveboot"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	say := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	p, err := liveboot.FetchParts(ctx, testenv.Cache(), say)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bootchain:", err)
		os.Exit(1)
	}
	say("boot chain %s: %s", p.ABI, filepath.Base(p.Dir))
	for _, pkg := range slices.Sorted(maps.Keys(p.Packages)) {
		say("  %s %s", pkg, p.Packages[pkg])
	}
	prev, err := liveboot.FetchPreviousKernel(ctx, testenv.Cache(), p, say)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bootchain:", err)
		os.Exit(1)
	}
	say("previous kernel %s: %s", prev.ABI, filepath.Base(prev.Dir))
	rt, err := liveboot.FetchRuntime(ctx, testenv.Cache(), say)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bootchain:", err)
		os.Exit(1)
	}
	say("container runtime %s %s: %s", liveboot.RuntimePackage, rt.Version, filepath.Base(rt.Dir))
}
