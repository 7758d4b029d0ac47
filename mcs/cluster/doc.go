// Package cluster is what `nodeproof serve` needs in cluster mode, where
// it replaces the in-cluster OpenShift Machine Config Server (`start
// --kubeconfig --apiserver-url`): inputs watched from the API server, and
// a Kubernetes bootstrap token per attested node, and the certificates and
// provisioning tokens kept in the cluster's objects. It does no HTTP;
// errors go to callbacks and return values, except the Keeper's, which
// runs on its own and logs one line per change or refusal.
//
// # Inputs (Watch)
//
// Watch keeps informer caches of MachineConfigPools, MachineConfigs and
// the ControllerConfig named machine-config-controller (the one the MCS
// reads; a field selector keeps others out) and hands render.Inputs to a
// callback when they sync and, debounced (1 s quiet, at most 10 s late),
// after changes that alter what is served. The caller builds a
// render.Renderer and swaps it in with mcs.Server.SetConfigs.
//
// The caches are controller-runtime's (sigs.k8s.io/controller-runtime/pkg/cache)
// over the github.com/openshift/api typed objects, rather than client-go
// dynamic informers: the objects arrive typed, so a rebuild does not
// convert every MachineConfig (megabytes each, and every rendered
// generation is kept) from unstructured maps; list and watch retry with
// client-go's backoff; watch errors reach the caller through
// DefaultWatchErrorHandler instead of klog. The OpenShift MCS uses
// openshift/client-go's generated informers, which are the same
// client-go machinery but are not a dependency of this module.
//
// Configs wraps the rendered configs: before the caches synced every
// config request is ErrNotSynced, a pool the cluster does not have is
// ErrNoSuchPool, and a pool whose rendered MachineConfig, source
// MachineConfigs or ControllerConfig have not all arrived is ErrIncomplete
// (the three informers are separate watch streams, so a pool can arrive
// before what it names); all wrap mcs.ErrNotReady, which mcs answers with
// 503 and Retry-After (the in-cluster MCS answers a missing pool with a
// 500), so Ignition retries and never takes a partial config.
//
// # Per-node bootstrap tokens (Tokens)
//
// The in-cluster MCS puts one shared, long-lived credential into every
// config: the node-bootstrapper service account's token. For an attested
// node nodeproof instead creates a bootstrap token that is the node's
// alone and expires with its NodeAttestation record (Tokens.Issue draws
// it when the record is written; Tokens.Activate creates its Secret at the
// config's first delivery — the Secret is the config token's single-use
// marker, so the delivery costs one write, not two — and Tokens.Revoke
// deletes it when no byte of that config left), and serves that node a
// kubeconfig with it (Tokens.Kubeconfig, behind mcs.Rendered.Kubeconfig;
// the secret travels sealed in the config token, so nothing is read back). The kubeconfig is built as the MCS builds
// its own (Kubeconfig, mirroring kubeconfigFromSecret in MCO
// pkg/server/cluster_server.go): server = --apiserver-url (the internal
// API URL), CA = MCOCABundle (ConfigMap
// openshift-machine-config-operator/kubeconfig-data, else the mounted
// service account secret's ca.crt), user "kubelet" with token
// <id>.<secret>. The token authenticates as system:bootstrap:<id>, in
// system:bootstrappers, system:bootstrappers:nodeproof and
// system:bootstrappers:nodeproof:<pool>; the CSR approver accepts the
// kubelet's CSR only from the user the record names.
//
// Requirements on the cluster: kube-apiserver must authenticate bootstrap
// tokens (--enable-bootstrap-token-auth; kubeadm sets it; check your
// distribution), and the group system:bootstrappers:nodeproof must be
// allowed to create CSRs (deploy/cluster/node-bootstrap-rbac.yaml binds
// system:node-bootstrapper, as the MCO binds it to node-bootstrapper).
// Expired token Secrets are refused by the API server at once; they are
// deleted by Tokens.GC (the server runs it) or the kube-controller-manager's
// tokencleaner, which is off by default.
//
// # Token tier and full-without-credentials: the shared kubeconfig
//
// A request with the provisioning token (the token tier) or to a pool with
// serve.fullWithoutCredentials has no node identity. Such requests get
// what the in-cluster MCS serves everyone: ServiceAccountKubeconfig, the
// node-bootstrapper service account's token from the mounted directory.
// The alternative, a fresh bootstrap token per request, was rejected:
// whoever holds the one shared provisioning token could mint any number
// of node credentials (and Secrets in kube-system), none tied to evidence
// or to a record the approver could check, so it would add risk and no
// assurance. The risk that remains, and that the token tier documents: a
// holder of the provisioning token obtains the shared, long-lived
// service-account token, exactly what any network peer of the stock MCS
// obtains today; pools that must not expose it take attestation only
// (serve.token: false, the default).
//
// # The certificates and tokens kept in the cluster (Keeper)
//
// With --cert-store=cluster and --token-store=cluster, the MCS CA and
// serving certificate (mcs/certs/kubecerts) and the provisioning tokens
// (TokenSecret, the Secret of the OpenShift enhancement "Support a
// provisioning token for the Machine Config Server") are shared by every
// replica: each reads them every reload interval and serves the last good
// state, and only the holder of the Lease KeeperLease (package leader)
// makes them on first start, rotates them when due and keeps the
// user-data Secrets current (Keeper.Leading).
//
// # RBAC
//
// What the server's service account needs, and why (deploy/cluster/rbac.yaml;
// a test runs Watch and Tokens as a service account holding exactly that):
//
//	machineconfiguration.openshift.io  machineconfigs, machineconfigpools,
//	                                   controllerconfigs   get list watch   (cluster-wide) Watch's informers
//	""  secrets     kube-system        create get delete list
//	                                   create: Activate; get: Delivered (a second delivery, a session
//	                                   answered again); delete: Revoke and GC; list: GC (by label). Bootstrap tokens
//	                                   must live in kube-system, and RBAC cannot narrow create/list/delete to
//	                                   names not yet known, so this grants reading and deleting every Secret
//	                                   in kube-system: treat the service account as that powerful.
//	""  configmaps  openshift-machine-config-operator  get list watch (resourceNames: kubeconfig-data)
//	                                   CABundleWatch: a watch on that one ConfigMap, GET until it syncs
//
// The store's CRDs (NodeAttestation records) need their own rules; the
// embedded store needs none.
package cluster
