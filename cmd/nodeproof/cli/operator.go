package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"time"

	bolterrors "go.etcd.io/bbolt/errors"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/adminsock"
	"github.com/nodeproof/nodeproof/store/kubestore"
	"github.com/nodeproof/nodeproof/store/operate"
)

// storeReader is what an operator's views read from the store; the
// running server's admin socket serves it too.
type storeReader interface {
	inspect.Store
	Close() error
}

// operatorStore is an operator's command's store: its reads, and the
// operator's workflows (package operate) — run on the store in this
// process, or in the running server that holds it.
type operatorStore struct {
	storeReader
	ops operate.Operations
}

// openOperatorStore opens the store for an operator's command: with the
// embedded store, the running server's admin socket when it answers (bbolt
// locks the file while the server runs), else the file itself; with the
// kubernetes store, the API server.
func openOperatorStore(ctx context.Context, c serve.Config) (*operatorStore, error) {
	if c.StoreKind(adminCluster(c)) == "embedded" {
		cl, err := dialServer(ctx, adminsock.Path(c.StateDir))
		if err != nil {
			return nil, err
		}
		if cl != nil {
			return &operatorStore{storeReader: cl, ops: cl}, nil
		}
		// An operator's command never makes a store: a mistyped
		// --state-dir would otherwise show an empty one, or ban into a
		// file no server reads.
		db := filepath.Join(c.StateDir, serve.StoreFile)
		if _, err := os.Lstat(db); errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no store in --state-dir %s (no %s, and no server answers on %s): is it the server's --state-dir? The server makes its store at its first start", c.StateDir, serve.StoreFile, adminsock.Path(c.StateDir))
		}
	}
	st, err := c.OpenStoreTimeout(adminCluster(c), time.Second)
	if err != nil {
		if c.StoreKind(adminCluster(c)) != "embedded" {
			return nil, fmt.Errorf("open the store: %w", err)
		}
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("open the store: no server answers on %s, and another process holds %s locked: %w", adminsock.Path(c.StateDir), filepath.Join(c.StateDir, "state.db"), err)
		}
		return nil, fmt.Errorf("open the store (no server answers on %s; is --state-dir %s right?): %w", adminsock.Path(c.StateDir), c.StateDir, err)
	}
	return &operatorStore{storeReader: st, ops: operate.On{Store: st}}, nil
}

// clusterEffects are a workflow's effects on the cluster (operate.Effects):
// the identity's bootstrap tokens deleted, the Event on its NodeBinding.
type clusterEffects struct {
	kc kubernetes.Interface
	ns string
}

// DeleteIdentityTokens implements operate.Effects.
func (e clusterEffects) DeleteIdentityTokens(ctx context.Context, identity string, records []string) ([]string, error) {
	return cluster.DeleteIdentityTokens(ctx, e.kc, identity, records)
}

// WriteEvent implements operate.Effects.
func (e clusterEffects) WriteEvent(ctx context.Context, ev operate.Event) error {
	return kubestore.WriteEvent(ctx, e.kc, e.ns, ev.Component, kubestore.BindingEvent{NodeName: ev.NodeName, Reason: ev.Reason,
		Message: ev.Message, Warning: ev.Warning, Time: ev.Time, UID: types.UID(ev.UID)})
}

// effects are the workflows' effects outside the store: on the cluster
// with the kubernetes store, none otherwise.
func effects(c serve.Config) (operate.Effects, error) {
	kc, err := c.KubeClient(adminCluster(c))
	if err != nil || kc == nil {
		return nil, err
	}
	return clusterEffects{kc: kc, ns: c.StoreNamespace}, nil
}

// finish prints a workflow's outcome and does its effects, printing the
// bootstrap tokens it deleted.
func finish(ctx context.Context, c serve.Config, o *operate.Outcome, stdout io.Writer) error {
	fmt.Fprintln(stdout, o.Message)
	eff, err := effects(c)
	if err != nil || eff == nil {
		return err
	}
	deleted, err := o.Apply(ctx, eff)
	if len(deleted) > 0 {
		fmt.Fprintf(stdout, "deleted its bootstrap tokens: %s\n", strings.Join(deleted, ", "))
	}
	return err
}

// dialServer connects to the running server's admin socket: nil and no
// error when no server answers there (the caller opens the file itself),
// an error when the socket, its directory or the process serving it is
// not the server's user's (adminsock.ErrUntrusted): nothing is sent to it,
// and nothing falls back to the file behind an impostor's back.
func dialServer(ctx context.Context, sock string) (*adminsock.Client, error) {
	cl, err := adminsock.Dial(ctx, sock)
	switch {
	case err == nil:
		return cl, nil
	case errors.Is(err, adminsock.ErrUntrusted):
		return nil, fmt.Errorf("refusing the admin socket: %w", err)
	default:
		return nil, nil
	}
}

// operator is who runs the command, as the store records it: --by when
// given; with the kubernetes store, the user the API server authenticates
// (a SelfSubjectReview), else the kubeconfig's user; else $SUDO_USER,
// $USER or the process's user.
func operator(ctx context.Context, c serve.Config, by string) string {
	if by != "" {
		return by
	}
	if c.StoreKind(adminCluster(c)) == "kubernetes" {
		if cfg, err := serve.RESTConfig(c.Kubeconfig); err == nil {
			if kc, err := kubernetes.NewForConfig(cfg); err == nil {
				ssr, err := kc.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
				if err == nil && ssr.Status.UserInfo.Username != "" {
					return ssr.Status.UserInfo.Username
				}
			}
		}
		if c.Kubeconfig != "" {
			if raw, err := clientcmd.LoadFromFile(c.Kubeconfig); err == nil {
				if ctx, ok := raw.Contexts[raw.CurrentContext]; ok && ctx.AuthInfo != "" {
					return ctx.AuthInfo
				}
			}
		}
	}
	for _, v := range []string{"SUDO_USER", "USER"} {
		if u := os.Getenv(v); u != "" {
			return u
		}
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "unknown"
}

// actFlags are the flags of an operator's act: --reason and --by.
func actFlags(fs *flag.FlagSet) (reason, by *string) {
	reason = fs.String("reason", "", "why (kept in the store, and in the Event)")
	by = fs.String("by", "", "who (default: the user the API server authenticates, or $SUDO_USER / $USER)")
	return reason, by
}

// opCmd is an operator's command with its flags parsed and its store open
// (close it).
type opCmd struct {
	c           serve.Config
	node        string
	identity    string
	reason, who string
	notEnrolled bool // --not-enrolled: revoke an identity nodeproof has never seen
	st          *operatorStore
}

// startOp parses an operator's command: the store flags, --reason and
// --by, and either one NODE or, with byIdentity, NODE or --identity ID;
// then it opens the store.
func startOp(ctx context.Context, in *invocation, byIdentity bool) (*opCmd, error) {
	fs := in.flags()
	op := &opCmd{}
	storeFlags(fs, &op.c)
	reason, by := actFlags(fs)
	identity, notEnrolled := new(string), new(bool)
	if byIdentity {
		identity = fs.String("identity", "", "the identity (tpm-ek:…, gcp:…, aws:…; nodeproof inspect lists them), instead of NODE's: exactly as the server writes it")
		if in.cmd.name == "revoke" {
			notEnrolled = fs.Bool("not-enrolled", false, "with --identity: revoke an identity this server has never seen (no binding, ban or released name), e.g. a stolen machine not yet enrolled")
		}
	}
	pos, err := in.parse()
	if err != nil {
		return nil, err
	}
	// The identity's spelling is the workflow's to check (operate), where
	// the admin socket checks it too.
	if *notEnrolled && *identity == "" {
		return nil, in.usageError("--not-enrolled goes with --identity")
	}
	op.notEnrolled = *notEnrolled
	switch {
	case len(pos) > 1:
		return nil, in.usageError("one NODE, got %q", pos)
	case len(pos) == 1 && *identity != "":
		return nil, in.usageError("NODE and --identity exclude each other")
	case len(pos) == 0 && *identity == "" && byIdentity:
		return nil, in.usageError("NODE or --identity ID is required")
	case len(pos) == 0 && !byIdentity:
		return nil, in.usageError("one NODE is required")
	case len(pos) == 1:
		op.node = pos[0]
	}
	op.c.Clock = time.Now
	op.identity, op.reason, op.who = *identity, *reason, operator(ctx, op.c, *by)
	if op.st, err = openOperatorStore(ctx, op.c); err != nil {
		return nil, err
	}
	return op, nil
}

// cmdRelease frees a node name from the identity that owns it (its
// binding), so that another machine — or the same one, reinstalled, with
// a new kubelet key, or enrolling in another pool — may enrol with it. The
// binding goes to the name's history (who, when, why); a revoked
// identity stays banned (nodeproof unban lifts that). It says whose node
// it was, and with the kubernetes store writes an Event on the
// NodeBinding. A running server with the embedded store is reached on its
// admin socket.
func cmdRelease(ctx context.Context, in *invocation) error {
	fs := in.flags()
	var c serve.Config
	storeFlags(fs, &c)
	reason, by := actFlags(fs)
	pos, err := in.exactly(1)
	if err != nil {
		return err
	}
	c.Clock = time.Now
	return release(ctx, c, pos[0], store.Act{At: c.Clock(), By: operator(ctx, c, *by), Reason: *reason}, in.stdout)
}

func release(ctx context.Context, c serve.Config, node string, act store.Act, stdout io.Writer) error {
	st, err := openOperatorStore(ctx, c)
	if err != nil {
		return err
	}
	defer st.Close()
	o, err := st.ops.Release(ctx, operate.Naming{Node: node, Act: act})
	if err != nil {
		return err
	}
	return finish(ctx, c, o, stdout)
}

// cmdEnroll --reset NODE releases a node name (release); --reset KEY, a
// key with a slash (aws-instance/<account>/<instance id>), clears a
// single-use marker that an earlier version set.
func cmdEnroll(ctx context.Context, in *invocation) error {
	stdout := in.stdout
	fs := in.flags()
	reset := fs.String("reset", "", "the node to release (as nodeproof release NODE), or a single-use marker's key to clear (required)")
	var c serve.Config
	storeFlags(fs, &c)
	by := fs.String("by", "", "who (default: the user the API server authenticates, or $SUDO_USER / $USER)")
	if _, err := in.exactly(0); err != nil {
		return err
	}
	if *reset == "" {
		return in.usageError("--reset NODE is required")
	}
	c.Clock = time.Now
	if !strings.Contains(*reset, "/") {
		return release(ctx, c, *reset, store.Act{At: c.Clock(), By: operator(ctx, c, *by), Reason: "enroll --reset"}, stdout)
	}
	st, err := openOperatorStore(ctx, c)
	if err != nil {
		return err
	}
	defer st.Close()
	o, err := st.ops.ClearMarker(ctx, *reset)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, o.Message)
	return nil
}

// cmdRevoke bans a machine: the identity that holds NODE, or --identity ID
// (enrolled or not). From then on the identity is refused everything —
// enrolment under any name and in any pool, re-attestation, config
// fetches with tokens issued before, every CSR, report ownership — and
// its records approve nothing; the approver's node controller taints its
// node NoExecute. With the kubernetes store the node's bootstrap token
// Secrets are deleted at once (the operator's credentials must allow
// list and delete of secrets in kube-system; a failure is reported, the
// ban stands). The ban outlives `nodeproof release`, restarts and leader
// changes; `nodeproof unban` lifts it. Kubelet certificates already issued
// stay valid until they expire (the signer's duration; docs/lifetime.md).
func cmdRevoke(ctx context.Context, in *invocation) error {
	op, err := startOp(ctx, in, true)
	if err != nil {
		return err
	}
	defer op.st.Close()
	o, err := op.st.ops.Revoke(ctx, operate.Revocation{Node: op.node, Identity: op.identity, NotEnrolled: op.notEnrolled, Act: op.act()})
	if err != nil {
		return err
	}
	return finish(ctx, op.c, o, in.stdout)
}

// cmdUnban lifts a ban: the identity that holds NODE, or was banned while
// holding it, or --identity ID. The identity may then re-attest and, if
// it holds no name, enrol again (after attesting, as any machine).
func cmdUnban(ctx context.Context, in *invocation) error {
	op, err := startOp(ctx, in, true)
	if err != nil {
		return err
	}
	defer op.st.Close()
	o, err := op.st.ops.Unban(ctx, operate.Lift{Node: op.node, Identity: op.identity, Act: op.act()})
	if err != nil {
		return err
	}
	return finish(ctx, op.c, o, in.stdout)
}

// cmdAdopt lets a pool with requested node names bind the name of a Node
// that existed before nodeproof (cluster mode refuses such a name
// NodeNotAdopted): it records the adoption (who, when, why) in the name's
// history. The name is nodeproof's from then on: once a machine enrols
// with it, releasing it keeps the Node tainted until another enrols.
func cmdAdopt(ctx context.Context, in *invocation) error {
	op, err := startOp(ctx, in, false)
	if err != nil {
		return err
	}
	defer op.st.Close()
	o, err := op.st.ops.Adopt(ctx, operate.Naming{Node: op.node, Act: op.act()})
	if err != nil {
		return err
	}
	return finish(ctx, op.c, o, in.stdout)
}

// act is the operator's act: now, by whom, why.
func (op *opCmd) act() store.Act { return store.Act{At: op.c.Clock(), By: op.who, Reason: op.reason} }
