package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// storeFlags are the flags of the commands that open the store beside a
// server: release and enroll.
func storeFlags(fs *flag.FlagSet, c *ServeConfig) {
	fs.StringVar(&c.Store, "store", "embedded", "embedded or kubernetes")
	fs.StringVar(&c.StateDir, "state-dir", "/var/lib/nodeproof", "embedded store: the server's state directory")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubernetes store: kubeconfig (default: in-cluster)")
	fs.StringVar(&c.StoreNamespace, "store-namespace", "nodeproof", "kubernetes store: namespace")
}

// cmdRelease frees a node name from the identity that owns it (its
// binding), so that another machine — or the same one, reinstalled, with
// a new kubelet key — may enrol with it. It says whose node it was, and
// with the kubernetes store writes an Event on the NodeBinding. The
// embedded store cannot be opened while the server runs (bbolt locks its
// file): stop the server, or use the kubernetes store.
func cmdRelease(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("release", stderr)
	var c ServeConfig
	storeFlags(fs, &c)
	reason := fs.String("reason", "", "why (goes into the Event)")
	node, err := parseOneNode(fs, args)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	c.Clock = time.Now
	return release(ctx, c, node, *reason, stdout)
}

func release(ctx context.Context, c ServeConfig, node, reason string, stdout io.Writer) error {
	st, err := c.openStoreTimeout(false, time.Second)
	if err != nil {
		return fmt.Errorf("release: open the store (with the embedded store, stop the server first): %w", err)
	}
	defer st.Close()
	b, err := st.Release(ctx, node)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("release: node %s is not bound to any machine", node)
	} else if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	msg := fmt.Sprintf("node %s released: it was bound to %s (%s evidence, pool %s, enrolled %s, last enrolment record %s); the next machine to enrol with this name owns it",
		node, b.Identity, b.Kind, b.Pool, b.CreatedAt.UTC().Format(time.RFC3339), b.RecordID)
	if reason != "" {
		msg += "; reason: " + reason
	}
	fmt.Fprintln(stdout, msg)
	kc, err := c.kubeClient(false)
	if err != nil || kc == nil {
		return err
	}
	return kubestore.WriteEvent(ctx, kc, c.storeNamespace(), "nodeproof-release",
		kubestore.BindingEvent{NodeName: node, Reason: "Released", Message: msg, Time: c.Clock()})
}

// cmdEnroll --reset NODE releases a node name (release); --reset KEY, a
// key with a slash (aws-instance/<account>/<instance id>), clears a
// single-use marker that an earlier version set.
func cmdEnroll(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("enroll", stderr)
	reset := fs.String("reset", "", "the node to release (as nodeproof release NODE), or a single-use marker's key to clear")
	var c ServeConfig
	storeFlags(fs, &c)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *reset == "" {
		return errors.New("enroll: --reset NODE is required")
	}
	c.Clock = time.Now
	if !strings.Contains(*reset, "/") {
		return release(ctx, c, *reset, "enroll --reset", stdout)
	}
	st, err := c.openStoreTimeout(false, time.Second)
	if err != nil {
		return fmt.Errorf("enroll: open the store (with the embedded store, stop the server first): %w", err)
	}
	defer st.Close()
	if err := st.ReleaseOnce(ctx, *reset); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "cleared %s\n", *reset)
	return nil
}

// cmdRevoke refuses a node's identity everything from now on — attestations,
// configs, certificates — and (through the approver's node controller) taints
// the node NoExecute. `nodeproof release NODE` afterwards frees the name for
// another machine. Kubelet certificates already issued stay valid until they
// expire (the signer's duration; docs/lifetime.md).
func cmdRevoke(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("revoke", stderr)
	var c ServeConfig
	storeFlags(fs, &c)
	reason := fs.String("reason", "", "why (kept on the binding, and in the Event)")
	node, err := parseOneNode(fs, args)
	if err != nil {
		return fmt.Errorf("revoke: %w", err)
	}
	c.Clock = time.Now
	st, err := c.openStoreTimeout(false, time.Second)
	if err != nil {
		return fmt.Errorf("revoke: open the store (with the embedded store, stop the server first): %w", err)
	}
	defer st.Close()
	b, err := st.Revoke(ctx, node, *reason, c.Clock())
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("revoke: node %s is not bound to any machine", node)
	} else if err != nil {
		return fmt.Errorf("revoke: %w", err)
	}
	msg := fmt.Sprintf("node %s revoked at %s (%s evidence, identity %s): attestations, configs and certificates are refused; release it to give the name to another machine",
		node, b.Revoked.At.UTC().Format(time.RFC3339), b.Kind, b.Identity)
	if b.Revoked.Reason != "" {
		msg += "; reason: " + b.Revoked.Reason
	}
	fmt.Fprintln(stdout, msg)
	kc, err := c.kubeClient(false)
	if err != nil || kc == nil {
		return err
	}
	return kubestore.WriteEvent(ctx, kc, c.storeNamespace(), "nodeproof-revoke",
		kubestore.BindingEvent{NodeName: node, Reason: "Revoked", Message: msg, Warning: true, Time: c.Clock()})
}

// parseOneNode parses fs with args, which hold exactly one node name,
// before or among the flags.
func parseOneNode(fs *flag.FlagSet, args []string) (string, error) {
	if err := fs.Parse(args); err != nil {
		return "", err
	}
	var node string
	if fs.NArg() > 0 {
		node = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return "", err
		}
	}
	if node == "" || fs.NArg() != 0 {
		return "", errors.New("one NODE is required")
	}
	return node, nil
}
