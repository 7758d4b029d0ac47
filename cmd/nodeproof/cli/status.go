package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/certs/kubecerts"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/adminsock"
	"github.com/nodeproof/nodeproof/store/boltstore"
)

// cmdStatus is `nodeproof status`: what a running server judges by and
// serves, and the state of its store, without Prometheus. Directory mode
// asks the server on its admin socket (the policy version in force and
// the last reload it refused, the certificate it serves, the CAs) and
// checks the store; cluster mode reads the leader's Lease, what each
// replica published in ConfigMap nodeproof-server-status (the same, per
// replica), the certificates kept in the cluster and the store. A view:
// it changes nothing.
func cmdStatus(ctx context.Context, in *invocation) error {
	fs := in.flags()
	var c serve.Config
	storeFlags(fs, &c)
	certsNamespaceFlag(fs, &c.CertsNamespace)
	if _, err := in.exactly(0); err != nil {
		return err
	}
	c.Clock = time.Now
	w := in.stdout
	now := c.Clock()
	if adminCluster(c) {
		return clusterStatus(ctx, c, w, now)
	}
	// One connection to the running server answers everything; without
	// one, the file itself.
	path, sock := filepath.Join(c.StateDir, serve.StoreFile), adminsock.Path(c.StateDir)
	cl, err := dialServer(ctx, sock)
	if err != nil {
		return err
	}
	var rep boltstore.Report
	if cl == nil {
		fmt.Fprintf(w, "server:      none answers on %s\n", sock)
		rep, err = boltstore.Check(path, time.Second)
	} else {
		defer cl.Close()
		var s serve.Status
		if err := cl.Status(ctx, &s); err != nil {
			return err
		}
		printServerStatus(w, s, now)
		rep, err = cl.Check(ctx, path)
	}
	if err != nil {
		fmt.Fprintf(w, "store:       NOT OK: %v\n", err)
		return errFailed
	}
	fmt.Fprintf(w, "store:       ok: %s\n", describe(rep))
	var st store.Operator = cl
	if cl == nil {
		if st, err = openOperatorStore(ctx, c); err != nil {
			return err
		}
		defer st.Close()
	}
	return printCounts(ctx, w, st)
}

func printServerStatus(w io.Writer, s serve.Status, now time.Time) {
	fmt.Fprintf(w, "server:      running, pid %d, %s mode, since %s; secure %s", s.PID, s.Mode, s.StartedAt.UTC().Format(time.RFC3339), s.Secure)
	if s.Insecure != "" {
		fmt.Fprintf(w, ", insecure %s", s.Insecure)
	}
	fmt.Fprintln(w)
	printReplica(w, s, now)
	fmt.Fprintln(w, "leader:      this server (directory mode: one replica)")
}

// printReplica prints what one server judges by and serves: the policy
// version in force and a refused reload, its certificate and CAs.
func printReplica(w io.Writer, s serve.Status, now time.Time) {
	p := s.Policy
	fmt.Fprintf(w, "policy:      %s version %s, in force since %s\n", orNone(p.File), p.Version, p.Since.UTC().Format(time.RFC3339))
	if p.Refused != "" {
		fmt.Fprintf(w, "reload:      REFUSED at %s, version %s: %s (the version above stays in force)\n", p.RefusedAt.UTC().Format(time.RFC3339), p.Refused, p.Error)
	} else {
		fmt.Fprintln(w, "reload:      no refusal stands")
	}
	if s.Serving != nil {
		fmt.Fprintf(w, "serving:     %v, valid to %s (%s)", s.Serving.Names, s.Serving.NotAfter.UTC().Format(time.RFC3339), left(s.Serving.NotAfter, now))
		if !sameNames(s.Serving.Names, s.Hosts) {
			fmt.Fprintf(w, "; NOT the --hosts it was started with, %v", s.Hosts)
		}
		fmt.Fprintln(w)
	}
	for _, ca := range s.CAs {
		fmt.Fprintf(w, "CA:          %s, valid to %s (%s)\n", ca.Subject, ca.NotAfter.UTC().Format(time.RFC3339), left(ca.NotAfter, now))
	}
	if s.CAError != "" {
		fmt.Fprintf(w, "CA:          cannot be read: %s\n", s.CAError)
	}
}

// left says how long until t.
func left(t, now time.Time) string {
	d := t.Sub(now)
	switch {
	case d <= 0:
		return "EXPIRED"
	case d < 48*time.Hour:
		return fmt.Sprintf("%s left", d.Round(time.Minute))
	}
	return fmt.Sprintf("%d days left", int(d.Hours()/24))
}

// printCounts prints the store's bindings (and how many are revoked),
// bans and names' histories.
func printCounts(ctx context.Context, w io.Writer, st store.Operator) error {
	bs, err := st.Bindings(ctx)
	if err != nil {
		return err
	}
	revoked := 0
	for _, b := range bs {
		if b.Revoked != nil {
			revoked++
		}
	}
	bans, err := st.Bans(ctx)
	if err != nil {
		return err
	}
	hs, err := st.Histories(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "records:     %d node bindings (%d revoked), %d bans, %d names with a history\n", len(bs), revoked, len(bans), len(hs))
	return nil
}

// clusterStatus is status in cluster mode.
func clusterStatus(ctx context.Context, c serve.Config, w io.Writer, now time.Time) error {
	cfg, err := serve.RESTConfig(c.Kubeconfig)
	if err != nil {
		return err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ns := c.LeaseNamespace()
	lease, err := kc.CoordinationV1().Leases(ns).Get(ctx, cluster.KeeperLease, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		fmt.Fprintf(w, "leader:      none (no Lease %s/%s: no replica keeps certificates or tokens in the cluster, or none has started)\n", ns, cluster.KeeperLease)
	case err != nil:
		fmt.Fprintf(w, "leader:      Lease %s/%s: %v\n", ns, cluster.KeeperLease, err)
	case lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "":
		fmt.Fprintf(w, "leader:      none (Lease %s/%s held by no replica)\n", ns, cluster.KeeperLease)
	default:
		renewed := "never renewed"
		if lease.Spec.RenewTime != nil {
			renewed = "renewed " + lease.Spec.RenewTime.UTC().Format(time.RFC3339)
			if d := lease.Spec.LeaseDurationSeconds; d != nil && now.Sub(lease.Spec.RenewTime.Time) > time.Duration(*d)*time.Second {
				renewed += ", EXPIRED: no replica leads"
			}
		}
		fmt.Fprintf(w, "leader:      %s (%s)\n", *lease.Spec.HolderIdentity, renewed)
	}
	replicas, err := serve.ReadReplicaStatus(ctx, kc, ns)
	switch {
	case err != nil:
		fmt.Fprintf(w, "replicas:    %v (each replica's policy version is also its metric nodeproof_server_policy_info and its log)\n", err)
	case len(replicas) == 0:
		fmt.Fprintf(w, "replicas:    none has published its status in ConfigMap %s/%s yet\n", ns, serve.ReplicaStatusConfigMap)
	}
	for _, r := range replicas {
		fresh := "updated " + r.UpdatedAt.UTC().Format(time.RFC3339)
		if now.Sub(r.UpdatedAt) > 3*time.Minute {
			fresh += ", STALE: the replica stopped or cannot write"
		}
		fmt.Fprintf(w, "replica:     %s (%s)\n", r.Identity, fresh)
		printReplica(w, r.Status, now)
	}
	read, err := kubecerts.New(kubecerts.Options{Client: kc, Namespace: c.CertsNamespace, Clock: time.Now})
	if err == nil {
		snap, rerr := read.Read(ctx)
		switch {
		case errors.Is(rerr, kubecerts.ErrAbsent):
			fmt.Fprintf(w, "cluster:     no certificates kept in the cluster (namespace %s): the replicas serve their own (--cert-store=state-dir, or --cert)\n", c.CertsNamespace)
		case rerr != nil:
			fmt.Fprintf(w, "cluster:     %v\n", rerr)
		default:
			fmt.Fprintf(w, "cluster:     serving certificate (Secret %s/%s) for %v, valid to %s (%s)\n", c.CertsNamespace, kubecerts.ServingName, certs.Names(snap.Serving), snap.Serving.NotAfter.UTC().Format(time.RFC3339), left(snap.Serving.NotAfter, now))
			fmt.Fprintf(w, "cluster:     %d CA in ConfigMap %s/%s\n", strings.Count(string(snap.BundlePEM), "BEGIN CERTIFICATE"), c.CertsNamespace, kubecerts.CAName)
		}
	}
	st, err := openOperatorStore(ctx, c)
	if err != nil {
		return err
	}
	defer st.Close()
	fmt.Fprintf(w, "store:       kubernetes, namespace %s\n", ns)
	return printCounts(ctx, w, st)
}
