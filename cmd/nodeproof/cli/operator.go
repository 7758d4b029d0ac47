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

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/adminsock"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

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
			return &operatorStore{Operator: cl}, nil
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
	ks, _ := st.(*kubestore.Store) // the kubernetes store: its NodeBindings' UIDs
	return &operatorStore{Operator: st, kube: ks}, nil
}

// operatorStore is the store an operator's command opened: what it may do
// with it (store.Operator: a running server's admin socket, or the store
// itself) and, with the kubernetes store, the NodeBindings' UIDs its
// Events name.
type operatorStore struct {
	store.Operator
	kube *kubestore.Store // nil but with the kubernetes store
}

// bindingUID is the uid of node's NodeBinding with the kubernetes store
// (so `kubectl describe nodebinding` shows the Event), else "".
func (s *operatorStore) bindingUID(ctx context.Context, node string) types.UID {
	if s.kube == nil {
		return ""
	}
	uid, err := s.kube.BindingUID(ctx, node)
	if err != nil {
		return ""
	}
	return uid
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
	if *identity != "" {
		// A ban keyed by any other spelling than the server's would
		// match no machine while saying "revoked".
		if _, err := attest.ParseIdentity(*identity); err != nil {
			return nil, fmt.Errorf("--identity: %w", err)
		}
	}
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
	uid := st.bindingUID(ctx, node) // the Event names the binding released
	b, err := st.Release(ctx, node, act)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("node %s is not bound to any machine", node)
	} else if err != nil {
		return err
	}
	msg := fmt.Sprintf("node %s released by %s: it was bound to %s (%s evidence, pool %s, enrolled %s, last enrolment record %s); the next machine to enrol with this name owns it",
		node, act.By, b.Identity, b.Kind, b.Pool, b.CreatedAt.UTC().Format(time.RFC3339), b.RecordID)
	if b.Revoked != nil {
		msg += "; that machine stays revoked (banned) under any name: nodeproof unban --identity " + b.Identity + " lifts it"
	}
	if act.Reason != "" {
		msg += "; reason: " + act.Reason
	}
	fmt.Fprintln(stdout, msg)
	return bindingEvent(ctx, c, st, "nodeproof-release", kubestore.BindingEvent{NodeName: node, Reason: "Released", Message: msg, Time: c.Clock(), UID: uid})
}

// bindingEvent writes ev with the kubernetes store (nothing otherwise),
// naming the binding's uid (so kubectl describe nodebinding lists it) when
// ev does not and st has the binding.
func bindingEvent(ctx context.Context, c serve.Config, st *operatorStore, component string, ev kubestore.BindingEvent) error {
	kc, err := c.KubeClient(adminCluster(c))
	if err != nil || kc == nil {
		return err
	}
	if ev.UID == "" {
		ev.UID = st.bindingUID(ctx, ev.NodeName)
	}
	return kubestore.WriteEvent(ctx, kc, c.StoreNamespace, component, ev)
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
	if err := st.ReleaseOnce(ctx, *reset); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "cleared %s\n", *reset)
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
	stdout := in.stdout
	op, err := startOp(ctx, in, true)
	if err != nil {
		return err
	}
	c, st := op.c, op.st
	defer st.Close()
	if op.identity != "" {
		seen, err := identitySeen(ctx, st, op.identity)
		if err != nil {
			return err
		}
		if !seen && !op.notEnrolled {
			return fmt.Errorf("%s is not enrolled, and this server has never seen it (no binding, no ban, no released name): nothing was revoked. Check the identity (nodeproof inspect lists them), or give --not-enrolled to ban one that has not enrolled yet", op.identity)
		}
	}
	ban, err := st.Ban(ctx, store.Ban{Identity: op.identity, NodeName: op.node, At: c.Clock(), By: op.who, Reason: op.reason})
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("node %s is not bound to any machine (a machine that holds no name: --identity ID)", op.node)
	} else if err != nil {
		return err
	}
	where := "not enrolled: it holds no node name, and the ban stands when it tries"
	if ban.NodeName != "" {
		where = "enrolled as node " + ban.NodeName
	}
	msg := fmt.Sprintf("%s (%s evidence, %s) revoked at %s by %s: enrolment under any name, re-attestation, configs, certificates and reports are refused until nodeproof unban",
		ban.Identity, dash(string(ban.Kind)), where, ban.At.UTC().Format(time.RFC3339), ban.By)
	if ban.Reason != "" {
		msg += "; reason: " + ban.Reason
	}
	fmt.Fprintln(stdout, msg)
	kc, err := c.KubeClient(adminCluster(c))
	if err != nil || kc == nil {
		return err
	}
	var records []string
	if ban.NodeName != "" {
		if recs, err := st.RecordsForNode(ctx, ban.NodeName); err == nil {
			for _, r := range recs {
				if r.Identity == ban.Identity {
					records = append(records, r.ID)
				}
			}
		}
	}
	deleted, derr := cluster.DeleteIdentityTokens(ctx, kc, ban.Identity, records)
	if len(deleted) > 0 {
		fmt.Fprintf(stdout, "deleted its bootstrap tokens: %s\n", strings.Join(deleted, ", "))
	}
	if derr != nil {
		derr = fmt.Errorf("the ban stands, but its bootstrap tokens could not all be deleted (they expire with their records): %w", derr)
	}
	if ban.NodeName == "" {
		return derr
	}
	return errors.Join(derr, kubestore.WriteEvent(ctx, kc, c.StoreNamespace, "nodeproof-revoke",
		kubestore.BindingEvent{NodeName: ban.NodeName, Reason: "Revoked", Message: msg, Warning: true, Time: c.Clock(), UID: st.bindingUID(ctx, ban.NodeName)}))
}

// cmdUnban lifts a ban: the identity that holds NODE, or was banned while
// holding it, or --identity ID. The identity may then re-attest and, if
// it holds no name, enrol again (after attesting, as any machine).
func cmdUnban(ctx context.Context, in *invocation) error {
	stdout := in.stdout
	op, err := startOp(ctx, in, true)
	if err != nil {
		return err
	}
	c, st := op.c, op.st
	defer st.Close()
	id := op.identity
	if id == "" {
		if id, err = bannedAt(ctx, st, op.node); err != nil {
			return err
		}
	}
	ban, err := st.Unban(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%s is not banned", id)
	} else if err != nil {
		return err
	}
	msg := fmt.Sprintf("ban of %s lifted by %s (it was banned at %s by %s: %s)", ban.Identity, op.who,
		ban.At.UTC().Format(time.RFC3339), dash(ban.By), dash(ban.Reason))
	if op.reason != "" {
		msg += "; reason: " + op.reason
	}
	fmt.Fprintln(stdout, msg)
	if ban.NodeName == "" {
		return nil
	}
	return bindingEvent(ctx, c, st, "nodeproof-unban", kubestore.BindingEvent{NodeName: ban.NodeName, Reason: "Unbanned", Message: msg, Time: c.Clock()})
}

// identitySeen says whether this store knows identity: enrolled, banned,
// or released from a name.
func identitySeen(ctx context.Context, st store.Operator, identity string) (bool, error) {
	if _, err := st.BindingOf(ctx, identity); !errors.Is(err, store.ErrNotFound) {
		return err == nil, err
	}
	if _, err := st.BanOf(ctx, identity); !errors.Is(err, store.ErrNotFound) {
		return err == nil, err
	}
	hs, err := st.Histories(ctx)
	if err != nil {
		return false, err
	}
	for _, h := range hs {
		for _, r := range h.Released {
			if r.Identity == identity {
				return true, nil
			}
		}
	}
	return false, nil
}

// bannedAt is the banned identity that holds node, or that held it when
// it was banned (exactly one).
func bannedAt(ctx context.Context, st store.Operator, node string) (string, error) {
	if b, err := st.Binding(ctx, node); err == nil {
		return b.Identity, nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return "", err
	}
	bans, err := st.Bans(ctx)
	if err != nil {
		return "", err
	}
	var ids []string
	for _, b := range bans {
		if b.NodeName == node {
			ids = append(ids, b.Identity)
		}
	}
	switch len(ids) {
	case 0:
		return "", fmt.Errorf("no banned identity holds or held node %s", node)
	case 1:
		return ids[0], nil
	}
	return "", fmt.Errorf("%d banned identities held node %s (%s): name one with --identity", len(ids), node, strings.Join(ids, ", "))
}

// cmdAdopt lets a pool with requested node names bind the name of a Node
// that existed before nodeproof (cluster mode refuses such a name
// NodeNotAdopted): it records the adoption (who, when, why) in the name's
// history. The name is nodeproof's from then on: once a machine enrols
// with it, releasing it keeps the Node tainted until another enrols.
func cmdAdopt(ctx context.Context, in *invocation) error {
	stdout := in.stdout
	op, err := startOp(ctx, in, false)
	if err != nil {
		return err
	}
	c, st, node := op.c, op.st, op.node
	defer st.Close()
	h, err := st.Adopt(ctx, node, store.Act{At: c.Clock(), By: op.who, Reason: op.reason})
	if err != nil {
		return err
	}
	msg := fmt.Sprintf("node %s adopted by %s at %s: a machine may enrol with this name in a pool that takes requested names", node, h.Adopted.By, h.Adopted.At.UTC().Format(time.RFC3339))
	fmt.Fprintln(stdout, msg)
	return bindingEvent(ctx, c, st, "nodeproof-adopt", kubestore.BindingEvent{NodeName: node, Reason: "Adopted", Message: msg, Time: c.Clock()})
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
