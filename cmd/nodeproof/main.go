// Command nodeproof is the hardware-attested Machine Config Server, the
// kubelet CSR approver and the operator's tools (serve, approve, pointer,
// ca, token, keys, release, revoke, inspect, policy, …): every command and
// its flags are in cmd/nodeproof/cli and docs/cli.md.
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
