// Command nodeproof-demo is `make demo`: see cmd/nodeproof-demo/demo.
//
// SIGINT (Ctrl-C) and SIGTERM stop it cleanly: everything it started
// stops and its temporary directory is removed. If it is killed outright
// (SIGKILL), the kernel kills what it started (parent-death signals), but
// the temporary directory stays behind.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nodeproof/nodeproof/cmd/nodeproof-demo/demo"
)

func main() {
	dir := flag.String("dir", "", "working directory (a temporary one, removed afterwards, when empty)")
	log := flag.String("log", "rhel8-uefi", "real firmware event log to boot from (see firmware-testdata)")
	boot := flag.Bool("boot", false, "make demo-boot: the story on a live VM (QEMU, OVMF Secure Boot, Debian's signed boot chain; needs make tools and --guest-bin)")
	guestBin := flag.String("guest-bin", "", "with --boot: the directory holding the static nodeproof-agent and kubeletcsr for the VM's initramfs")
	bin := flag.String("bin", "", "directory of nodeproof and nodeproof-agent (make build's bin/); empty: built into the working directory")
	cluster := flag.Bool("cluster", false, "make dev-cluster: only a cluster of your own (etcd and kube-apiserver from make tools) in --dir, until Ctrl-C; prints its kubeconfig")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o := demo.Options{Dir: *dir, Log: *log, Bin: *bin, Out: os.Stdout, Clock: time.Now}
	var err error
	switch {
	case *cluster:
		if err = demo.RunCluster(ctx, o); err == nil {
			fmt.Fprintln(os.Stderr, "cluster stopped")
			return
		}
	case *boot:
		err = demo.RunBoot(ctx, o, *guestBin)
	default:
		err = demo.Run(ctx, o)
	}
	switch {
	case err == nil:
	case ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "demo stopped by a signal; everything it started has stopped")
		os.Exit(1)
	default:
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}
