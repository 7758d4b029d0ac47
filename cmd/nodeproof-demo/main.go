// Command nodeproof-demo is `make demo`: see internal/demo.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/nodeproof/nodeproof/internal/demo"
)

func main() {
	dir := flag.String("dir", "", "working directory (a temporary one, removed afterwards, when empty)")
	log := flag.String("log", "rhel8-uefi", "real firmware event log to boot from (see firmware-testdata)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := demo.Run(ctx, demo.Options{Dir: *dir, Log: *log, Out: os.Stdout, Clock: time.Now}); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}
