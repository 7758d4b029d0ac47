// Command nodeproof is the hardware-attested Machine Config Server and its
// tools: serve, ca, pointer, token, version. See cmd/nodeproof/cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
