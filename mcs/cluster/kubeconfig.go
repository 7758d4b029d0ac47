package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Where the OpenShift MCS finds what it builds the served kubeconfig from
// (MCO pkg/server/cluster_server.go).
const (
	// DefaultBootstrapTokenDir is where the MCS DaemonSet mounts the
	// node-bootstrapper service account's token Secret: ca.crt and token.
	DefaultBootstrapTokenDir = "/etc/mcs/bootstrap-token"
	// MCONamespace holds KubeconfigDataConfigMap.
	MCONamespace = "openshift-machine-config-operator"
	// KubeconfigDataConfigMap, when it exists, overrides the CA: its
	// binaryData[KubeconfigDataCAKey] is the bundle that trusts the
	// internal API server URL (the MCO keeps it current across rotations).
	KubeconfigDataConfigMap = "kubeconfig-data"
	KubeconfigDataCAKey     = "ca-bundle.crt"
)

// Kubeconfig returns the kubeconfig the MCS serves at
// /etc/kubernetes/kubeconfig, built as the MCO's kubeconfigFromSecret
// builds it: one cluster "local" (server, CA data), one user "kubelet"
// with the bearer token, one context "kubelet", current. Serialised by
// clientcmd (apiVersion v1, kind Config), which the kubelet reads with the
// same clientcmd.
func Kubeconfig(server string, ca []byte, token string) ([]byte, error) {
	switch {
	case server == "":
		return nil, errors.New("cluster: kubeconfig needs an API server URL")
	case len(ca) == 0:
		return nil, errors.New("cluster: kubeconfig needs a CA bundle")
	case token == "":
		return nil, errors.New("cluster: kubeconfig needs a token")
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["kubelet"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kubelet"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "kubelet"}
	cfg.CurrentContext = "kubelet"
	return clientcmd.Write(*cfg)
}

// MCOCABundle returns the CA bundle the OpenShift MCS puts in the
// kubeconfig it serves: binaryData["ca-bundle.crt"] of the ConfigMap
// openshift-machine-config-operator/kubeconfig-data when that ConfigMap
// exists, else the file caFile (<bootstrap token dir>/ca.crt). Each call
// reads both afresh, as the MCS does per request, so rotations are
// followed. Unlike the MCS, which falls back to the file on any error, a
// failed read other than NotFound is an error: a transient API failure
// must not hand a node a CA that may no longer be the right one.
// client may be nil: then only the file is read.
func MCOCABundle(client kubernetes.Interface, caFile string) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		if client != nil {
			cm, err := client.CoreV1().ConfigMaps(MCONamespace).Get(ctx, KubeconfigDataConfigMap, metav1.GetOptions{})
			switch {
			case err == nil:
				if ca := cm.BinaryData[KubeconfigDataCAKey]; len(ca) > 0 {
					return ca, nil
				}
			case !apierrors.IsNotFound(err):
				return nil, fmt.Errorf("cluster: CA bundle from ConfigMap %s/%s: %w", MCONamespace, KubeconfigDataConfigMap, err)
			}
		}
		ca, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("cluster: CA bundle: %w", err)
		}
		return ca, nil
	}
}

// ServiceAccountKubeconfig is the shared kubeconfig the OpenShift MCS
// serves every node: the token file in tokenDir (the node-bootstrapper
// service account's, long-lived), the CA from ca, the URL server.
// nodeproof serves it only where no node identity exists: the token tier
// and serve.fullWithoutCredentials (see the package documentation).
func ServiceAccountKubeconfig(ctx context.Context, tokenDir, server string, ca func(context.Context) ([]byte, error)) ([]byte, error) {
	tok, err := os.ReadFile(filepath.Join(tokenDir, corev1.ServiceAccountTokenKey))
	if err != nil {
		return nil, fmt.Errorf("cluster: service account token: %w", err)
	}
	caData, err := ca(ctx)
	if err != nil {
		return nil, err
	}
	return Kubeconfig(server, caData, string(tok))
}

// CABundleWatch is MCOCABundle without a GET per request: a watch on the
// one ConfigMap kubeconfig-data (a client-go informer with a metadata.name
// field selector, which RBAC's resourceNames allows for list and watch)
// keeps it in memory. Until the watch has synced (and if it never does, e.g.
// without list/watch permission) Get reads as MCOCABundle does, so nothing
// is served from a cache that has not seen the cluster yet.
type CABundleWatch struct {
	get      func(context.Context) ([]byte, error) // the fallback: MCOCABundle
	file     func(context.Context) ([]byte, error) // MCOCABundle without a client: the file
	informer cache.SharedIndexInformer
}

// NewCABundleWatch prepares the watch; Run starts it.
func NewCABundleWatch(client kubernetes.Interface, caFile string) *CABundleWatch {
	lw := cache.NewListWatchFromClient(client.CoreV1().RESTClient(), "configmaps", MCONamespace,
		fields.OneTermEqualSelector("metadata.name", KubeconfigDataConfigMap))
	return &CABundleWatch{
		get: MCOCABundle(client, caFile), file: MCOCABundle(nil, caFile),
		informer: cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{}),
	}
}

// Run watches until ctx ends.
func (w *CABundleWatch) Run(ctx context.Context) { w.informer.RunWithContext(ctx) }

// Get returns the bundle: the ConfigMap's when it exists, else the file's.
func (w *CABundleWatch) Get(ctx context.Context) ([]byte, error) {
	if !w.informer.HasSynced() {
		return w.get(ctx)
	}
	obj, ok, err := w.informer.GetStore().GetByKey(MCONamespace + "/" + KubeconfigDataConfigMap)
	if err != nil {
		return nil, fmt.Errorf("cluster: CA bundle from ConfigMap %s/%s: %w", MCONamespace, KubeconfigDataConfigMap, err)
	}
	if cm, isCM := obj.(*corev1.ConfigMap); ok && isCM {
		if ca := cm.BinaryData[KubeconfigDataCAKey]; len(ca) > 0 {
			return ca, nil
		}
	}
	return w.file(ctx)
}

// Synced reports whether the watch has synced.
func (w *CABundleWatch) Synced() bool { return w.informer.HasSynced() }
