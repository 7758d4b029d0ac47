package cli

import (
	"flag"
	"time"

	"github.com/nodeproof/nodeproof/mcs/certs/kubecerts"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/serve"
)

// The flags serve and the admin commands share: each setting has one name,
// one default and one meaning in every command, so an operator passes an
// admin command the flags the deployment passes serve (docs/cli.md).
const (
	defaultStateDir = "/var/lib/nodeproof"
	defaultReload   = 10 * time.Second
)

// kubeconfigFlag is --kubeconfig: with it, a command works on the cluster
// (serve: cluster mode; the others: the kubernetes store and the objects
// serve keeps in the cluster).
func kubeconfigFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "kubeconfig", "", "the cluster's kubeconfig: serve's cluster mode; for the other commands, the kubernetes store and what serve keeps in the cluster (default: $KUBECONFIG unless --state-dir or --server-basedir is given; empty: --state-dir; the in-cluster service account with --store=kubernetes, or serve's --apiserver-url)")
}

// stateDirFlag is --state-dir.
func stateDirFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "state-dir", defaultStateDir, "the server's state directory: CA (certs/), sealing keys (keys.json), provisioning tokens (tokens.json), embedded store (state.db)")
}

// storeFlags are --store, --store-namespace, --state-dir and --kubeconfig:
// where the records and bindings are.
func storeFlags(fs *flag.FlagSet, c *serve.Config) {
	fs.StringVar(&c.Store, "store", "", "embedded (bbolt in --state-dir) or kubernetes (CRDs in --store-namespace); default: kubernetes with --kubeconfig (cluster mode), else embedded")
	fs.StringVar(&c.StoreNamespace, "store-namespace", serve.DefaultStoreNamespace, "kubernetes store: namespace of the NodeAttestation, AttestationMarker and NodeBinding objects (and their Events)")
	stateDirFlag(fs, &c.StateDir)
	kubeconfigFlag(fs, &c.Kubeconfig)
}

// certsNamespaceFlag is --certs-namespace.
func certsNamespaceFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "certs-namespace", kubecerts.DefaultNamespace, "certificates kept in the cluster (--cert-store=cluster): namespace of ConfigMap and Secret machine-config-server-ca and Secret machine-config-server-tls (deploy/base: nodeproof)")
}

// tokenNamespaceFlag is --token-secret-namespace.
func tokenNamespaceFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "token-secret-namespace", cluster.TokenSecretNamespace, "provisioning tokens kept in the cluster (--token-store=cluster): namespace of Secret machineconfig-auth (deploy/base: nodeproof)")
}

// keysFileFlag is --keys-file.
func keysFileFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "keys-file", "", "sealing keyring shared by replicas (default <state-dir>/keys.json; created if missing)")
}

// reloadFlag is --reload-interval.
func reloadFlag(fs *flag.FlagSet, p *time.Duration) {
	fs.DurationVar(p, "reload-interval", defaultReload, "how often serve checks its inputs, certificates and tokens for changes (a token newer than 3 times this is not yet known to every replica)")
}

// adminCluster reports whether an admin command works on the cluster: it
// was given --kubeconfig, as serve's cluster mode is.
func adminCluster(c serve.Config) bool { return c.Kubeconfig != "" }
