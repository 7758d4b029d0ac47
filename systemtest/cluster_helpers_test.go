package systemtest_test

import (
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
)

// testCluster starts a control plane with nodeproof's CRDs and returns its
// admin config, a clientset and a controller-runtime client for it.
func testCluster(t *testing.T) (*rest.Config, kubernetes.Interface, client.Client) {
	t.Helper()
	cfg := clustertest.Start(t, "../deploy/crds")
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, kc, c
}

// writePolicy writes b's policy to dir/policy.yaml and returns its path.
func writePolicy(t *testing.T, dir string, b *policytest.Builder) string {
	t.Helper()
	path, err := b.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// clusterStatePolicy: worker serves its public tier; master only the
// provisioning token's.
func clusterStatePolicy() *policytest.Builder {
	return policytest.New().Pool("worker", policytest.Public()).Pool("master", policytest.Public().Private().Token())
}
