// Command nodeproof-agent runs on a new machine: it attests with the
// machine's TPM to nodeproof's Machine Config Server and hands the config
// token to Ignition (or fetches the full config itself on first boot).
// See cmd/nodeproof-agent/agentcli for the flags and agent for what it does.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/nodeproof/nodeproof/cmd/nodeproof-agent/agentcli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := agentcli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
