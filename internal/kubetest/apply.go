package kubetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ApplyYAML creates every object of a multi-document YAML file (the files
// in deploy/), failing the test on the first that the API server refuses.
func ApplyYAML(t testing.TB, c client.Client, file string) {
	t.Helper()
	if err := ApplyFile(context.Background(), c, file); err != nil {
		t.Fatal(err)
	}
}

// ApplyFile is ApplyYAML for programs (the demo).
func ApplyFile(ctx context.Context, c client.Client, file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := c.Create(ctx, &u); err != nil {
			return fmt.Errorf("%s: create %s %s: %w", file, u.GetKind(), u.GetName(), err)
		}
	}
}

// AsServiceAccount returns admin with the identity of the service account
// namespace/name (impersonation, as the API server would authenticate its
// token), so RBAC applies exactly as to that service account.
func AsServiceAccount(admin *rest.Config, namespace, name string) *rest.Config {
	c := rest.CopyConfig(admin)
	c.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":" + name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	return c
}
