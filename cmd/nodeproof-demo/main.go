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
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := demo.Run(ctx, demo.Options{Dir: *dir, Log: *log, Out: os.Stdout, Clock: time.Now})
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
