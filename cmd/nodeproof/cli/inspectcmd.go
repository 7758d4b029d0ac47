package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
)

// cmdInspect is `nodeproof inspect [NODE] [-o table|json|yaml]`: every
// node (its owner, last attestation and state), or one node's story
// (evidence, claims, records, and with the kubernetes store its Node's
// condition and taints, CSRs and Events). It only reads. The embedded
// store cannot be opened while the server runs (bbolt locks its file):
// stop the server, or use the kubernetes store.
func cmdInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("inspect", stderr)
	var c ServeConfig
	storeFlags(fs, &c)
	format := fs.String("o", inspect.FormatTable, "output: table, json or yaml")
	policyFile := fs.String("policy", "", "the server's policy: each pool's freshness window (default: the built-in policy's, 3 h)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var node string
	if fs.NArg() > 0 {
		node = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return err
		}
		if fs.NArg() != 0 {
			return errors.New("at most one NODE")
		}
	}
	if err := inspect.CheckFormat(*format); err != nil {
		return err
	}
	pol, err := loadPolicy(*policyFile)
	if err != nil {
		return err
	}
	c.Clock = time.Now
	st, err := c.openStoreTimeout(false, time.Second)
	if err != nil {
		return fmt.Errorf("open the store (with the embedded store, stop the server first): %w", err)
	}
	defer st.Close()
	kc, err := c.kubeClient(false)
	if err != nil {
		return err
	}
	src := inspect.Sources{Store: st, Kube: kc, Clock: c.Clock,
		Fresh: func(pool string) time.Duration { return pol.LifetimeOf(pool).StaleAfter.Duration }}
	if node == "" {
		nodes, err := inspect.List(ctx, src)
		if err != nil {
			return err
		}
		return inspect.WriteList(stdout, *format, nodes)
	}
	story, err := inspect.StoryOf(ctx, src, node)
	if err != nil {
		return err
	}
	return inspect.WriteStory(stdout, *format, story)
}
