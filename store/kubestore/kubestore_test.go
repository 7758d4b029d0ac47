package kubestore

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
	"github.com/nodeproof/nodeproof/store/storetest"
)

const (
	crdDir   = "../../deploy/crds"
	rbacFile = "../../deploy/store/rbac.yaml"
	// operatorRBACFile holds the operators' Role: the store operations
	// only operators run (Ban, Unban, Release, Adopt).
	operatorRBACFile = "../../deploy/operator/rbac.yaml"
	// The service account the RBAC tests run the store as (a subject of the
	// RoleBinding in rbacFile).
	saNamespace, saName = "nodeproof", "nodeproof-server"
)

func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// cluster is one kube-apiserver with the CRDs, shared by TestKubeStore's
// subtests.
type cluster struct {
	cfg   *rest.Config
	admin client.WithWatch
}

func (k *cluster) namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "store-"}}
	if err := k.admin.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func (k *cluster) store(t *testing.T, c client.Client, ns string, clock func() time.Time) *Store {
	t.Helper()
	s, err := New(c, ns, clock)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestKubeStore runs everything that needs an API server on one.
func TestKubeStore(t *testing.T) {
	cfg := kubetest.Start(t, crdDir)
	admin, err := client.NewWithWatch(cfg, client.Options{Scheme: testScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	k := &cluster{cfg: cfg, admin: admin}
	storeClient, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// Sequential groups (each may run its cases in parallel).
	t.Run("conformance", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T, clock func() time.Time) store.Store {
			return k.store(t, storeClient, k.namespace(t), clock)
		})
	})
	t.Run("conformance as the nodeproof-store service account", func(t *testing.T) { testAsServiceAccount(t, k) })
	t.Run("each verb of the role is needed", func(t *testing.T) { testVerbsNeeded(t, k) })
	t.Run("the API server validates", func(t *testing.T) { testValidation(t, k) })
	t.Run("printer columns", func(t *testing.T) { testPrinterColumns(t, k) })
	t.Run("records are selected by the API server", func(t *testing.T) { testFieldSelector(t, k) })
	t.Run("paging and bounds", func(t *testing.T) { testPaging(t, k) })
	t.Run("crash between marker and record", func(t *testing.T) { testOrphanMarkers(t, k) })
	t.Run("crash between identity marker and binding", func(t *testing.T) { testOrphanIdentityMarker(t, k) })
	t.Run("the approver's decision cache", func(t *testing.T) { testDecisionCache(t, k) })
	t.Run("kubelet certificate lineages", func(t *testing.T) { testLineages(t, k) })
	t.Run("the server's binding watch", func(t *testing.T) { testWatched(t, k) })
	t.Run("binding Events name the binding", func(t *testing.T) { testBindingEvents(t, k) })
	t.Run("a client without the types is refused", func(t *testing.T) {
		c, err := client.New(cfg, client.Options{Scheme: runtime.NewScheme()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := New(c, "default", time.Now); err == nil {
			t.Fatal("New accepted a client whose scheme lacks nodeproof.io/v1alpha1")
		}
	})
}

// decodeFile decodes every object of the multi-document YAML file path.
func decodeFile(t *testing.T, path string) []runtime.Object {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := serializer.NewCodecFactory(testScheme(t)).UniversalDeserializer()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var out []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(doc)) == "" {
			continue
		}
		obj, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, obj)
	}
}

// rbacObjects decodes deploy/store/rbac.yaml.
func rbacObjects(t *testing.T) (*rbacv1.Role, *rbacv1.RoleBinding) {
	t.Helper()
	var role *rbacv1.Role
	var binding *rbacv1.RoleBinding
	for _, obj := range decodeFile(t, rbacFile) {
		switch o := obj.(type) {
		case *rbacv1.Role:
			role = o
		case *rbacv1.RoleBinding:
			binding = o
		default:
			t.Fatalf("%s: unexpected %T", rbacFile, obj)
		}
	}
	if role == nil || binding == nil || role.Name != "nodeproof-store" || binding.RoleRef.Name != role.Name {
		t.Fatalf("%s: want Role nodeproof-store and a RoleBinding to it", rbacFile)
	}
	return role, binding
}

// operatorRules are the nodeproof.io rules of the Role nodeproof-operator
// in deploy/operator/rbac.yaml: what the operators' commands do in the
// store.
func operatorRules(t *testing.T) []rbacv1.PolicyRule {
	t.Helper()
	for _, obj := range decodeFile(t, operatorRBACFile) {
		if role, ok := obj.(*rbacv1.Role); ok && role.Name == "nodeproof-operator" {
			var out []rbacv1.PolicyRule
			for _, r := range role.Rules {
				if slices.Contains(r.APIGroups, v1alpha1.GroupVersion.Group) {
					out = append(out, r)
				}
			}
			return out
		}
	}
	t.Fatalf("%s: no Role nodeproof-operator", operatorRBACFile)
	return nil
}

// storeRules are the server's and the operators' store rules together:
// the whole store.Store, as the conformance suite runs it.
func storeRules(t *testing.T) []rbacv1.PolicyRule {
	role, _ := rbacObjects(t)
	return append(slices.Clone(role.Rules), operatorRules(t)...)
}

// grant installs role (with rules) and binding in ns, and waits until the
// authorizer sees them.
func (k *cluster) grant(t *testing.T, ns string, rules []rbacv1.PolicyRule, binding *rbacv1.RoleBinding) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "nodeproof-store", Namespace: ns}, Rules: rules}
	b := binding.DeepCopy()
	b.ObjectMeta = metav1.ObjectMeta{Name: binding.Name, Namespace: ns}
	for _, o := range []client.Object{role, b} {
		if err := k.admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	k.waitAllowed(t, ns, rules[0])
}

// waitAllowed waits until the service account may do r's first verb on its
// first resource in ns: the RBAC authorizer reads through informers, so a new
// Role or RoleBinding takes a moment to be in force.
func (k *cluster) waitAllowed(t *testing.T, ns string, r rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   "system:serviceaccount:" + saNamespace + ":" + saName,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + saNamespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Group: r.APIGroups[0], Resource: strings.Split(r.Resources[0], "/")[0],
				Subresource: subresource(r.Resources[0]), Verb: r.Verbs[0],
			},
		}}
		if err := k.admin.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("RBAC in %s not in force after 30s", ns)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func subresource(r string) string {
	_, sub, _ := strings.Cut(r, "/")
	return sub
}

func (k *cluster) saClient(t *testing.T) client.Client {
	t.Helper()
	c, err := NewClient(kubetest.AsServiceAccount(k.cfg, saNamespace, saName))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The whole conformance suite as a service account bound to exactly the
// Role in deploy/store/rbac.yaml: the Role is sufficient. (The file itself
// is applied as it is, too, to show it is valid as shipped.)
func testAsServiceAccount(t *testing.T, k *cluster) {
	ctx := context.Background()
	if err := k.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: saNamespace}}); err != nil {
		t.Fatal(err)
	}
	kubetest.ApplyYAML(t, k.admin, rbacFile)
	role, binding := rbacObjects(t)
	sa := k.saClient(t)

	k.waitAllowed(t, saNamespace, role.Rules[0])
	t.Run("as shipped", func(t *testing.T) {
		s := k.store(t, sa, saNamespace, time.Now)
		now := time.Now()
		r := storetest.Record(storetest.ID(1), "worker-1", now)
		if err := s.CreateRecord(ctx, r, store.Once{Key: "session/shipped", Expires: now.Add(time.Minute)}); err != nil {
			t.Fatalf("CreateRecord as %s in %s: %v", saName, saNamespace, err)
		}
		if err := s.ConsumeRecord(ctx, r.ID, "csr-1", now); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GC(ctx, now.Add(2*time.Hour)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("suite", func(t *testing.T) {
		// The server's Role and the operators' together: the suite runs
		// the operators' acts (Ban, Unban, Release, Adopt) too.
		rules := storeRules(t)
		storetest.Run(t, func(t *testing.T, clock func() time.Time) store.Store {
			ns := k.namespace(t)
			k.grant(t, ns, rules, binding)
			return k.store(t, sa, ns, clock)
		})
	})
	t.Run("the server's Role cannot ban, lift a ban or rewrite a name's history", func(t *testing.T) {
		ns := k.namespace(t)
		k.grant(t, ns, role.Rules, binding)
		s := k.store(t, sa, ns, func() time.Time { return storetest.T0 })
		b := &v1alpha1.NodeBinding{ObjectMeta: metav1.ObjectMeta{Name: "worker-1", Namespace: ns},
			Spec: v1alpha1.NodeBindingSpec{NodeName: "worker-1", Pool: "worker", Kind: "tpm", Identity: "tpm-ek:x",
				KubeletKeySHA256: strings.Repeat("ab", 32), RecordID: storetest.ID(1), CreatedAt: metav1.NewMicroTime(storetest.T0)}}
		ban := &v1alpha1.IdentityBan{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.BanName("tpm-ek:y"), Namespace: ns},
			Spec: v1alpha1.IdentityBanSpec{Identity: "tpm-ek:y", At: metav1.NewMicroTime(storetest.T0)}}
		for _, o := range []client.Object{b, ban} {
			if err := k.admin.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		for _, tc := range []struct {
			attack string
			op     func() error
		}{
			{"the server's account lifts a ban (Unban)", func() error { _, err := s.Unban(ctx, "tpm-ek:y"); return err }},
			{"the server's account bans an identity (Ban)", func() error {
				_, err := s.Ban(ctx, store.Ban{Identity: "tpm-ek:z", At: storetest.T0})
				return err
			}},
			{"the server's account releases a name, rewriting its history (Release)", func() error { _, err := s.Release(ctx, "worker-1"); return err }},
			{"the server's account adopts a name (Adopt)", func() error {
				_, err := s.Adopt(ctx, "legacy-1", store.Act{At: storetest.T0})
				return err
			}},
		} {
			got := "allowed"
			if err := tc.op(); apierrors.IsForbidden(err) {
				got = "Forbidden"
			} else if err != nil {
				got = "failed otherwise: " + err.Error()
			}
			attacktable.Check(t, "RBAC", tc.attack, "Forbidden", got)
		}
		if _, err := s.BanOf(ctx, "tpm-ek:y"); err != nil {
			t.Errorf("the ban is gone or unreadable: %v", err)
		}
	})
	t.Run("nothing more", func(t *testing.T) {
		ns := k.namespace(t)
		k.grant(t, ns, role.Rules, binding)
		other := k.namespace(t)
		r := &v1alpha1.NodeAttestation{ObjectMeta: metav1.ObjectMeta{Name: "r1", Namespace: ns}, Spec: validSpec()}
		if err := k.admin.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			op   func() error
		}{
			{"update a record", func() error {
				r := r.DeepCopy()
				r.Labels = map[string]string{"x": "y"}
				return sa.Update(ctx, r)
			}},
			{"patch a record", func() error {
				return sa.Patch(ctx, r.DeepCopy(), client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"x":"y"}}}`)))
			}},
			{"patch a record's status", func() error {
				return sa.Status().Patch(ctx, r.DeepCopy(), client.RawPatch("application/merge-patch+json", []byte(`{"status":{"consumedBy":"x"}}`)))
			}},
			{"delete all records at once", func() error {
				return sa.DeleteAllOf(ctx, &v1alpha1.NodeAttestation{}, client.InNamespace(ns))
			}},
			{"read records in another namespace", func() error {
				return sa.List(ctx, &v1alpha1.NodeAttestationList{}, client.InNamespace(other))
			}},
			{"read records in all namespaces", func() error {
				return sa.List(ctx, &v1alpha1.NodeAttestationList{})
			}},
			{"update a marker", func() error {
				m := &v1alpha1.AttestationMarker{ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: ns}}
				return sa.Update(ctx, m)
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if err := tc.op(); !apierrors.IsForbidden(err) {
					t.Fatalf("got %v, want Forbidden", err)
				}
			})
		}
		// Watch is not granted either (the store never watches).
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: "system:serviceaccount:" + saNamespace + ":" + saName,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Group: v1alpha1.GroupVersion.Group, Resource: "nodeattestations", Verb: "watch",
			},
		}}
		if err := k.admin.Create(ctx, sar); err != nil || sar.Status.Allowed {
			t.Fatalf("watch nodeattestations allowed=%v (%v), want refused", sar.Status.Allowed, err)
		}
	})
}

// Each verb of the Role is needed: without it, the store operation that uses
// it is refused.
func testVerbsNeeded(t *testing.T, k *cluster) {
	_, binding := rbacObjects(t)
	role := &rbacv1.Role{Rules: storeRules(t)}
	sa := k.saClient(t)
	ctx := context.Background()
	past := storetest.T0.Add(-time.Hour)
	expiredRecord := func(ns string) {
		r := &v1alpha1.NodeAttestation{ObjectMeta: metav1.ObjectMeta{Name: "expired", Namespace: ns}, Spec: validSpec()}
		r.Spec.Expires = metav1.NewMicroTime(past)
		if err := k.admin.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	marker := func(ns, key string, exp time.Time) {
		m := &v1alpha1.AttestationMarker{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.MarkerName(key), Namespace: ns},
			Spec: v1alpha1.AttestationMarkerSpec{Key: key, Expires: metav1.NewMicroTime(exp)}}
		if err := k.admin.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	bindingObj := func(ns string) {
		b := &v1alpha1.NodeBinding{ObjectMeta: metav1.ObjectMeta{Name: "worker-1", Namespace: ns},
			Spec: v1alpha1.NodeBindingSpec{NodeName: "worker-1", Pool: "worker", Kind: "tpm", Identity: "tpm-ek:x",
				KubeletKeySHA256: strings.Repeat("ab", 32), RecordID: storetest.ID(1), CreatedAt: metav1.NewMicroTime(storetest.T0)}}
		if err := k.admin.Create(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	banObj := func(ns string) {
		b := &v1alpha1.IdentityBan{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.BanName("tpm-ek:y"), Namespace: ns},
			Spec: v1alpha1.IdentityBanSpec{Identity: "tpm-ek:y", At: metav1.NewMicroTime(storetest.T0)}}
		if err := k.admin.Create(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	historyObj := func(ns string) {
		h := &v1alpha1.NodeNameHistory{ObjectMeta: metav1.ObjectMeta{Name: "legacy-1", Namespace: ns},
			Spec: v1alpha1.NodeNameHistorySpec{NodeName: "legacy-1"}}
		if err := k.admin.Create(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	// watchRefused starts the server's watch (the store itself never
	// watches): refused, and reads go to the API server meanwhile.
	watchRefused := func(s *Store) error {
		w, err := NewWatched(kubetest.AsServiceAccount(k.cfg, saNamespace, saName), s)
		if err != nil {
			return err
		}
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go w.Start(wctx)
		for deadline := time.Now().Add(10 * time.Second); w.WatchErr() == nil && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		return w.WatchErr()
	}
	cases := []struct {
		resource, verb string
		setup          func(ns string)
		op             func(s *Store) error
	}{
		{"nodeattestations", "create", nil, func(s *Store) error {
			return s.CreateRecord(ctx, storetest.Record(storetest.ID(1), "n", storetest.T0))
		}},
		{"nodeattestations", "get", expiredRecord, func(s *Store) error {
			_, err := s.GetRecord(ctx, "expired")
			return err
		}},
		{"nodeattestations", "list", nil, func(s *Store) error {
			_, err := s.RecordsForNode(ctx, "n")
			return err
		}},
		{"nodeattestations", "delete", expiredRecord, func(s *Store) error {
			_, err := s.GC(ctx, storetest.T0)
			return err
		}},
		{"nodeattestations/status", "update", expiredRecord, func(s *Store) error {
			return s.ConsumeRecord(ctx, "expired", "csr", storetest.T0)
		}},
		{"attestationmarkers", "create", nil, func(s *Store) error {
			return s.UseOnce(ctx, "k", storetest.T0.Add(time.Hour))
		}},
		{"attestationmarkers", "get", func(ns string) { marker(ns, "k", past) }, func(s *Store) error {
			return s.UseOnce(ctx, "k", storetest.T0.Add(time.Hour))
		}},
		{"attestationmarkers", "list", nil, func(s *Store) error {
			_, err := s.GC(ctx, storetest.T0)
			return err
		}},
		{"attestationmarkers", "delete", func(ns string) { marker(ns, "k", storetest.T0.Add(time.Hour)) }, func(s *Store) error {
			return s.ReleaseOnce(ctx, "k")
		}},
		{"nodebindings", "create", nil, func(s *Store) error {
			return s.Enrol(ctx, storetest.Record(storetest.ID(1), "n", storetest.T0), store.EnrolOptions{})
		}},
		{"nodebindings", "get", bindingObj, func(s *Store) error {
			_, err := s.Binding(ctx, "worker-1")
			return err
		}},
		{"nodebindings", "list", nil, func(s *Store) error {
			_, err := s.BindingOf(ctx, "tpm-ek:x")
			return err
		}},
		{"nodebindings", "watch", nil, watchRefused},
		{"nodebindings", "update", bindingObj, func(s *Store) error {
			r := storetest.Record(storetest.ID(2), "worker-1", storetest.T0)
			r.Identity, r.KubeletKeySHA256 = "tpm-ek:x", bytes.Repeat([]byte{0xab}, 32)
			return s.Enrol(ctx, r, store.EnrolOptions{Again: true})
		}},
		{"nodebindings", "delete", bindingObj, func(s *Store) error {
			_, err := s.Release(ctx, "worker-1")
			return err
		}},
		{"nodebindings/status", "update", bindingObj, func(s *Store) error {
			_, err := s.UpdateStatus(ctx, "worker-1", "tpm-ek:x", func(b *store.Binding) error { b.Status.Boots++; return nil })
			return err
		}},
		{"identitybans", "create", nil, func(s *Store) error {
			_, err := s.Ban(ctx, store.Ban{Identity: "tpm-ek:y", At: storetest.T0})
			return err
		}},
		{"identitybans", "get", nil, func(s *Store) error {
			_, err := s.BanOf(ctx, "tpm-ek:y")
			return err
		}},
		{"identitybans", "list", nil, func(s *Store) error {
			_, err := s.Bans(ctx)
			return err
		}},
		{"identitybans", "watch", nil, watchRefused},
		{"identitybans", "delete", banObj, func(s *Store) error {
			_, err := s.Unban(ctx, "tpm-ek:y")
			return err
		}},
		{"nodenamehistories", "create", nil, func(s *Store) error {
			_, err := s.Adopt(ctx, "legacy-1", store.Act{At: storetest.T0})
			return err
		}},
		{"nodenamehistories", "get", nil, func(s *Store) error {
			_, err := s.History(ctx, "legacy-1")
			return err
		}},
		{"nodenamehistories", "list", nil, func(s *Store) error {
			_, err := s.Histories(ctx)
			return err
		}},
		{"nodenamehistories", "watch", nil, watchRefused},
		{"nodenamehistories", "update", historyObj, func(s *Store) error {
			_, err := s.Adopt(ctx, "legacy-1", store.Act{At: storetest.T0})
			return err
		}},
	}
	if granted := verbs(role.Rules); granted != len(cases) {
		t.Fatalf("%s and %s grant %d resource verbs; this test covers %d", rbacFile, operatorRBACFile, granted, len(cases))
	}
	for _, tc := range cases {
		t.Run("without "+tc.verb+" "+tc.resource, func(t *testing.T) {
			t.Parallel()
			rules := withoutVerb(role.Rules, tc.resource, tc.verb)
			if verbs(rules) == verbs(role.Rules) {
				t.Fatalf("the role does not grant %s %s", tc.verb, tc.resource)
			}
			ns := k.namespace(t)
			k.grant(t, ns, rules, binding)
			if tc.setup != nil {
				tc.setup(ns)
			}
			s := k.store(t, sa, ns, func() time.Time { return storetest.T0 })
			if err := tc.op(s); !apierrors.IsForbidden(err) {
				t.Fatalf("got %v, want Forbidden", err)
			}
		})
	}
}

// verbs counts the distinct resource verbs rules grant.
func verbs(rules []rbacv1.PolicyRule) int {
	seen := map[string]bool{}
	for _, r := range rules {
		for _, res := range r.Resources {
			for _, v := range r.Verbs {
				seen[res+" "+v] = true
			}
		}
	}
	return len(seen)
}

// withoutVerb is rules without verb on resource (a rule left with no verb
// dropped).
func withoutVerb(rules []rbacv1.PolicyRule, resource, verb string) []rbacv1.PolicyRule {
	var out []rbacv1.PolicyRule
	for _, r := range rules {
		r := *r.DeepCopy()
		if slices.Contains(r.Resources, resource) {
			r.Verbs = slices.DeleteFunc(r.Verbs, func(v string) bool { return v == verb })
		}
		if len(r.Verbs) > 0 {
			out = append(out, r)
		}
	}
	return out
}

func validSpec() v1alpha1.NodeAttestationSpec {
	return v1alpha1.NodeAttestationSpec{
		NodeName: "worker-1", Pool: "worker", Kind: "tpm",
		KubeletKeySHA256: strings.Repeat("ab", 32),
		Addresses:        []string{"10.0.0.1"},
		BootstrapTokenID: "abc123",
		CreatedAt:        metav1.NewMicroTime(storetest.T0),
		Expires:          metav1.NewMicroTime(storetest.T0.Add(time.Hour)),
	}
}

// The CRDs' schemas and rules hold whoever writes: objects no store would
// write are refused, specs cannot change, and a consumed record stays
// consumed.
func testValidation(t *testing.T, k *cluster) {
	ctx := context.Background()
	ns := k.namespace(t)
	for _, tc := range []struct {
		name   string
		mutate func(o *v1alpha1.NodeAttestation)
	}{
		{"node name not a DNS subdomain", func(o *v1alpha1.NodeAttestation) { o.Spec.NodeName = "Worker_1" }},
		{"empty node name", func(o *v1alpha1.NodeAttestation) { o.Spec.NodeName = "" }},
		{"empty pool", func(o *v1alpha1.NodeAttestation) { o.Spec.Pool = "" }},
		{"unknown kind", func(o *v1alpha1.NodeAttestation) { o.Spec.Kind = "sgx" }},
		{"key hash in upper case", func(o *v1alpha1.NodeAttestation) { o.Spec.KubeletKeySHA256 = strings.Repeat("AB", 32) }},
		{"key hash too short", func(o *v1alpha1.NodeAttestation) { o.Spec.KubeletKeySHA256 = strings.Repeat("ab", 31) }},
		{"bootstrap token ID malformed", func(o *v1alpha1.NodeAttestation) { o.Spec.BootstrapTokenID = "abc" }},
		{"too many addresses", func(o *v1alpha1.NodeAttestation) {
			o.Spec.Addresses = slices.Repeat([]string{"10.0.0.1"}, 33)
		}},
		{"summary too long", func(o *v1alpha1.NodeAttestation) { o.Spec.Summary = strings.Repeat("x", 4097) }},
		{"no expiry", func(o *v1alpha1.NodeAttestation) { o.Spec.Expires = metav1.MicroTime{} }},
		{"name longer than a DNS label", func(o *v1alpha1.NodeAttestation) { o.Name = strings.Repeat("a", 64) }},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			o := &v1alpha1.NodeAttestation{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: ns}, Spec: validSpec()}
			tc.mutate(o)
			err := k.admin.Create(ctx, o)
			if !apierrors.IsInvalid(err) {
				t.Fatalf("got %v, want Invalid", err)
			}
			t.Log(err)
		})
	}
	t.Run("refused: marker without a key", func(t *testing.T) {
		m := &v1alpha1.AttestationMarker{ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: ns},
			Spec: v1alpha1.AttestationMarkerSpec{Expires: metav1.NewMicroTime(storetest.T0)}}
		if err := k.admin.Create(ctx, m); !apierrors.IsInvalid(err) {
			t.Fatalf("got %v, want Invalid", err)
		}
	})

	// Through the store: a record the API server refuses is an error that is
	// neither ErrUsed nor ErrExists, and leaves no marker behind.
	t.Run("CreateRecord of a refused record undoes its markers", func(t *testing.T) {
		s := k.store(t, k.admin, ns, func() time.Time { return storetest.T0 })
		r := storetest.Record(storetest.ID(9), "worker-1", storetest.T0)
		r.Pool = "Not A Pool"
		err := s.CreateRecord(ctx, r, store.Once{Key: "session/9", Expires: storetest.T0.Add(time.Hour)})
		if !apierrors.IsInvalid(err) || errors.Is(err, store.ErrUsed) || errors.Is(err, store.ErrExists) {
			t.Fatalf("got %v, want the API server's Invalid", err)
		}
		if err := s.UseOnce(ctx, "session/9", storetest.T0.Add(time.Hour)); err != nil {
			t.Fatalf("the refused record's marker was left set: %v", err)
		}
		r.KubeletKeySHA256 = r.KubeletKeySHA256[:31]
		if err := s.CreateRecord(ctx, r); err == nil || !strings.Contains(err.Error(), "32") {
			t.Fatalf("a 31-byte key hash: got %v", err)
		}
		r.KubeletKeySHA256 = make([]byte, 32)
		r.ID = "Not_An_ID"
		if err := s.CreateRecord(ctx, r); err == nil || !strings.Contains(err.Error(), "DNS label") {
			t.Fatalf("an ID that is no DNS label: got %v", err)
		}
	})

	// Transition rules.
	rec := &v1alpha1.NodeAttestation{ObjectMeta: metav1.ObjectMeta{Name: "r1", Namespace: ns}, Spec: validSpec()}
	if err := k.admin.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	mk := &v1alpha1.AttestationMarker{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.MarkerName("k"), Namespace: ns},
		Spec: v1alpha1.AttestationMarkerSpec{Key: "k", Expires: metav1.NewMicroTime(storetest.T0)}}
	if err := k.admin.Create(ctx, mk); err != nil {
		t.Fatal(err)
	}
	s := k.store(t, k.admin, ns, func() time.Time { return storetest.T0 })
	if err := s.ConsumeRecord(ctx, "r1", "csr-1", storetest.T0); err != nil {
		t.Fatal(err)
	}
	get := func(t *testing.T) *v1alpha1.NodeAttestation {
		var o v1alpha1.NodeAttestation
		if err := k.admin.Get(ctx, client.ObjectKeyFromObject(rec), &o); err != nil {
			t.Fatal(err)
		}
		return &o
	}
	for _, tc := range []struct {
		name string
		op   func(t *testing.T) error
	}{
		{"a record's spec", func(t *testing.T) error {
			o := get(t)
			o.Spec.KubeletKeySHA256 = strings.Repeat("cd", 32)
			return k.admin.Update(ctx, o)
		}},
		{"a consumed record back to unconsumed", func(t *testing.T) error {
			o := get(t)
			o.Status = v1alpha1.NodeAttestationStatus{}
			return k.admin.Status().Update(ctx, o)
		}},
		{"a consumed record's consumer", func(t *testing.T) error {
			o := get(t)
			o.Status.ConsumedBy = "csr-2"
			return k.admin.Status().Update(ctx, o)
		}},
		{"a marker's expiry", func(t *testing.T) error {
			var m v1alpha1.AttestationMarker
			if err := k.admin.Get(ctx, client.ObjectKeyFromObject(mk), &m); err != nil {
				t.Fatal(err)
			}
			m.Spec.Expires = metav1.NewMicroTime(storetest.T0.Add(time.Hour))
			return k.admin.Update(ctx, &m)
		}},
	} {
		t.Run("immutable: "+tc.name, func(t *testing.T) {
			err := tc.op(t)
			if !apierrors.IsInvalid(err) {
				t.Fatalf("got %v, want Invalid", err)
			}
			t.Log(err)
		})
	}
	if o := get(t); o.Status.ConsumedBy != "csr-1" || o.Spec.KubeletKeySHA256 != validSpec().KubeletKeySHA256 {
		t.Fatalf("record changed: %+v", o)
	}
}

// kubectl get's view: the server-side table with the CRD's printer columns.
func testPrinterColumns(t *testing.T, k *cluster) {
	ctx := context.Background()
	ns := k.namespace(t)
	s := k.store(t, k.admin, ns, time.Now)
	now := time.Now().Truncate(time.Second)
	for i, node := range []string{"worker-1", "worker-2"} {
		r := storetest.Record(storetest.ID(i), node, now)
		if err := s.CreateRecord(ctx, r, store.Once{Key: "session/" + node, Expires: now.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.ConsumeRecord(ctx, storetest.ID(0), "csr-abc", now); err != nil {
		t.Fatal(err)
	}
	table := func(t *testing.T, resource string) *metav1.Table {
		hc, err := rest.HTTPClientFor(k.cfg)
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet,
			fmt.Sprintf("%s/apis/%s/namespaces/%s/%s?includeObject=None", strings.TrimSuffix(k.cfg.Host, "/"), v1alpha1.GroupVersion, ns, resource), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s: %s", resource, resp.Status, body)
		}
		var tab metav1.Table
		if err := json.Unmarshal(body, &tab); err != nil {
			t.Fatal(err)
		}
		return &tab
	}
	columns := func(tab *metav1.Table) []string {
		var out []string
		for _, c := range tab.ColumnDefinitions {
			out = append(out, c.Name)
		}
		return out
	}
	t.Run("nodeattestations", func(t *testing.T) {
		tab := table(t, "nodeattestations")
		if got, want := columns(tab), []string{"Name", "Node", "Pool", "Kind", "Consumed", "Consumed-By", "Expires", "Age"}; !slices.Equal(got, want) {
			t.Fatalf("columns %v, want %v", got, want)
		}
		if len(tab.Rows) != 2 {
			t.Fatalf("%d rows", len(tab.Rows))
		}
		for i, row := range tab.Rows {
			c := row.Cells
			if c[0] != storetest.ID(i) || c[1] != fmt.Sprintf("worker-%d", i+1) || c[2] != "worker" || c[3] != "tpm" {
				t.Errorf("row %d: %v", i, c)
			}
			if consumed := c[4] != nil; consumed != (i == 0) {
				t.Errorf("row %d: Consumed %v", i, c[4])
			}
		}
		if c := tab.Rows[0].Cells; c[5] != "csr-abc" {
			t.Errorf("Consumed-By %v", c[5])
		}
	})
	t.Run("attestationmarkers", func(t *testing.T) {
		tab := table(t, "attestationmarkers")
		if got, want := columns(tab), []string{"Name", "Key", "Record", "Expires", "Age"}; !slices.Equal(got, want) {
			t.Fatalf("columns %v, want %v", got, want)
		}
		var keys []string
		for _, row := range tab.Rows {
			keys = append(keys, fmt.Sprint(row.Cells[1], " ", row.Cells[2]))
		}
		slices.Sort(keys)
		if want := []string{"session/worker-1 " + storetest.ID(0), "session/worker-2 " + storetest.ID(1)}; !slices.Equal(keys, want) {
			t.Fatalf("markers %v, want %v", keys, want)
		}
	})
	t.Run("nodebindings, right after enrolment", func(t *testing.T) {
		if err := s.Enrol(ctx, storetest.Record(storetest.ID(7), "worker-7", now), store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		tab := table(t, "nodebindings")
		if got, want := columns(tab), []string{"Name", "Kind", "Pool", "Enrolled", "Passed", "Reason", "Last-Success", "Revoked", "Identity", "Record", "Age"}; !slices.Equal(got, want) {
			t.Fatalf("columns %v, want %v", got, want)
		}
		if len(tab.Rows) != 1 {
			t.Fatalf("%d rows", len(tab.Rows))
		}
		// What the enrolment knows is shown before any re-attestation.
		if c := tab.Rows[0].Cells; c[0] != "worker-7" || c[1] != "tpm" || c[2] != "worker" || c[3] == nil || c[3] == "" {
			t.Errorf("row %v: want worker-7, tpm, worker and the enrolment's time", c)
		}
		if c := tab.Rows[0].Cells; c[4] != nil {
			t.Errorf("Passed %v before any attempt; want none", c[4])
		}
	})
	t.Run("nodebindings, after a failed re-attestation", func(t *testing.T) {
		claims := []byte(`{"kind":"tpm","identity":"` + storetest.Record(storetest.ID(7), "worker-7", now).Identity + `","tpm":{"secureBoot":true}}`)
		if _, err := s.UpdateStatus(ctx, "worker-7", storetest.Record(storetest.ID(7), "worker-7", now).Identity, func(b *store.Binding) error {
			b.Status = store.AttestationStatus{LastAttempt: now, Passed: false, Reason: "SecureBootDisabled", Claims: claims}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		tab := table(t, "nodebindings")
		if c := tab.Rows[0].Cells; c[4] != false || c[5] != "SecureBootDisabled" {
			t.Errorf("Passed %v, Reason %v; want false, SecureBootDisabled", c[4], c[5])
		}
		// The claims are an object (kubectl describe shows them field by
		// field), and read back as they were written.
		var u unstructured.Unstructured
		u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("NodeBinding"))
		if err := k.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "worker-7"}, &u); err != nil {
			t.Fatal(err)
		}
		if tpm, ok, _ := unstructured.NestedBool(u.Object, "status", "claims", "tpm", "secureBoot"); !ok || !tpm {
			t.Errorf("status.claims is not an object with tpm.secureBoot: %v", u.Object["status"])
		}
		b, err := s.Binding(ctx, "worker-7")
		var got, want any
		if err == nil {
			err = errors.Join(json.Unmarshal(b.Status.Claims, &got), json.Unmarshal(claims, &want))
		}
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("claims read back %s, %v; want %s", b.Status.Claims, err, claims)
		}
	})
	t.Run("expiry columns are dates, not ages", func(t *testing.T) {
		tab := table(t, "attestationmarkers")
		if exp, ok := tab.Rows[0].Cells[3].(string); !ok {
			t.Errorf("Expires %v: want the RFC 3339 time", tab.Rows[0].Cells[3])
		} else if _, err := time.Parse(time.RFC3339, exp); err != nil {
			t.Errorf("Expires %q: %v", exp, err)
		}
		for _, c := range tab.ColumnDefinitions {
			if c.Name == "Expires" && c.Type != "string" {
				t.Errorf("Expires is a %s column: kubectl shows a future date as <invalid>", c.Type)
			}
		}
	})
}

// RecordsForNode's filtering is the API server's: spec.nodeName is a
// selectable field, and a field that is not is refused (so a client-side
// filter could not be mistaken for it).
func testFieldSelector(t *testing.T, k *cluster) {
	ctx := context.Background()
	ns := k.namespace(t)
	s := k.store(t, k.admin, ns, time.Now)
	for i, node := range []string{"a", "b", "a"} {
		if err := s.CreateRecord(ctx, storetest.Record(storetest.ID(i), node, storetest.T0)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, field string
		want        int
		invalid     bool
	}{
		{"spec.nodeName", "spec.nodeName", 2, false},
		{"spec.pool is not selectable", "spec.pool", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l v1alpha1.NodeAttestationList
			err := k.admin.List(ctx, &l, client.InNamespace(ns), client.MatchingFields{tc.field: "a"})
			if tc.invalid {
				if !apierrors.IsBadRequest(err) && !apierrors.IsInvalid(err) {
					t.Fatalf("got %v, want the API server to refuse the selector", err)
				}
				return
			}
			if err != nil || len(l.Items) != tc.want {
				t.Fatalf("got %d items, %v; want %d", len(l.Items), err, tc.want)
			}
		})
	}
}

// Lists are paged, with no upper bound.
func testPaging(t *testing.T, k *cluster) {
	ctx := context.Background()
	ns := k.namespace(t)
	s := k.store(t, k.admin, ns, func() time.Time { return storetest.T0 })
	s.pageSize = 2
	for i := range 5 {
		r := storetest.Record(storetest.ID(i), "worker-1", storetest.T0.Add(time.Duration(i)*time.Second))
		if err := s.CreateRecord(ctx, r, store.Once{Key: fmt.Sprint("session/", i), Expires: storetest.T0.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateRecord(ctx, storetest.Record(storetest.ID(9), "worker-2", storetest.T0)); err != nil {
		t.Fatal(err)
	}
	rs, err := s.RecordsForNode(ctx, "worker-1")
	if err != nil || len(rs) != 5 || rs[0].ID != storetest.ID(4) || rs[4].ID != storetest.ID(0) {
		t.Fatalf("RecordsForNode over pages of 2: %d records, %v", len(rs), err)
	}
	if n, err := s.GC(ctx, storetest.T0.Add(24*time.Hour)); err != nil || n != 11 {
		t.Fatalf("GC over pages of 2 = %d, %v; want 11", n, err)
	}
}

// A crash between the markers and the record, simulated by a client that
// drops the record's create: the markers stay (the safe direction), block
// until they expire, then count as unset, and GC deletes them. The same when
// the create happened but its answer was lost.
func testOrphanMarkers(t *testing.T, k *cluster) {
	ctx := context.Background()
	var clock storetest.Clock
	clock.Set(storetest.T0)
	lost := errors.New("connection reset by peer")
	for _, tc := range []struct {
		name          string
		writes        bool // whether the record's create reaches the server
		recordWritten bool
	}{
		{"the record's create never arrives", false, false},
		{"the record's create arrives, its answer is lost", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock.Set(storetest.T0)
			ns := k.namespace(t)
			flaky := interceptor.NewClient(k.admin, interceptor.Funcs{
				Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					if _, ok := obj.(*v1alpha1.NodeAttestation); ok {
						if tc.writes {
							if err := c.Create(ctx, obj, opts...); err != nil {
								return err
							}
						}
						return lost
					}
					return c.Create(ctx, obj, opts...)
				},
			})
			crashy := k.store(t, flaky, ns, clock.Now)
			s := k.store(t, k.admin, ns, clock.Now)
			r := storetest.Record(storetest.ID(1), "worker-1", storetest.T0)
			err := crashy.CreateRecord(ctx, r, store.Once{Key: "session/1", Expires: storetest.T0.Add(5 * time.Minute)},
				store.Once{Key: "instance/1", Expires: storetest.T0.Add(time.Hour)})
			if !errors.Is(err, lost) {
				t.Fatalf("got %v, want the lost connection", err)
			}
			if _, err := s.GetRecord(ctx, r.ID); (err == nil) != tc.recordWritten {
				t.Fatalf("GetRecord after the lost create: %v", err)
			}
			var m v1alpha1.AttestationMarker
			if err := k.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: v1alpha1.MarkerName("session/1")}, &m); err != nil || m.Spec.RecordID != r.ID {
				t.Fatalf("orphan marker: %+v, %v; want it naming record %s", m.Spec, err, r.ID)
			}
			// The same record written again (the server answering the same
			// session after the crash) completes it: created if the first
			// create never arrived, ErrExists if it did; the earlier call's
			// markers stay either way.
			again := s.CreateRecord(ctx, r, store.Once{Key: "session/1", Expires: storetest.T0.Add(5 * time.Minute)},
				store.Once{Key: "instance/1", Expires: storetest.T0.Add(time.Hour)})
			if tc.recordWritten && !errors.Is(again, store.ErrExists) || !tc.recordWritten && again != nil {
				t.Fatalf("the same record again: %v (record written before: %v)", again, tc.recordWritten)
			}
			if _, err := s.GetRecord(ctx, r.ID); err != nil {
				t.Fatalf("the record after the retry: %v", err)
			}
			// The session cannot be replayed, the instance cannot re-enrol...
			r2 := storetest.Record(storetest.ID(2), "worker-1", storetest.T0)
			if err := s.CreateRecord(ctx, r2, store.Once{Key: "session/1", Expires: storetest.T0.Add(5 * time.Minute)}); !errors.Is(err, store.ErrUsed) {
				t.Fatalf("replayed session: got %v, want ErrUsed", err)
			}
			if err := s.CreateRecord(ctx, r2, store.Once{Key: "instance/1", Expires: storetest.T0.Add(time.Hour)}); !errors.Is(err, store.ErrUsed) {
				t.Fatalf("re-enrolment: got %v, want ErrUsed", err)
			}
			// ...until the instance marker expires.
			clock.Set(storetest.T0.Add(time.Hour))
			if err := s.CreateRecord(ctx, r2, store.Once{Key: "instance/1", Expires: storetest.T0.Add(2 * time.Hour)}); err != nil {
				t.Fatalf("re-enrolment after expiry: %v", err)
			}
			want := 3 // session/1, records 1 and 2 (expire T0+1h)
			if n, err := s.GC(ctx, clock.Now()); err != nil || n != want {
				t.Fatalf("GC = %d, %v; want %d", n, err, want)
			}
		})
	}
}

func TestDefinite(t *testing.T) {
	gr := schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "nodeattestations"}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"already exists", apierrors.NewAlreadyExists(gr, "x"), true},
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: "NodeAttestation"}, "x", nil), true},
		{"forbidden", apierrors.NewForbidden(gr, "x", errors.New("no")), true},
		{"wrapped conflict", fmt.Errorf("kubestore: %w", apierrors.NewConflict(gr, "x", errors.New("rv"))), true},
		{"internal error", apierrors.NewInternalError(errors.New("etcd")), false},
		{"timeout", apierrors.NewTimeoutError("slow", 1), false},
		{"server timeout", apierrors.NewServerTimeout(gr, "create", 1), false},
		{"too many requests", apierrors.NewTooManyRequests("later", 1), false},
		{"service unavailable", apierrors.NewServiceUnavailable("down"), false},
		{"context deadline", context.DeadlineExceeded, false},
		{"connection reset", errors.New("connection reset by peer"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := definite(tc.err); got != tc.want {
				t.Fatalf("definite(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestMarkerName(t *testing.T) {
	for _, tc := range []struct {
		name, key string
	}{
		{"session", "session/0123abcd"},
		{"empty", ""},
		{"unicode and spaces", "ïnstance / 42"},
		{"long", strings.Repeat("k", 1024)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := v1alpha1.MarkerName(tc.key)
			if len(n) != 64 || strings.Trim(n, "0123456789abcdef") != "" {
				t.Fatalf("MarkerName(%q) = %q, want 64 hex digits", tc.key, n)
			}
			if v1alpha1.MarkerName(tc.key+"x") == n {
				t.Fatal("different keys, same name")
			}
		})
	}
}

// A crash between an enrolment's identity marker and its binding leaves the
// marker alone: the same enrolment retried completes it; another enrolment
// of the identity is refused until the marker is OrphanAge old (no call
// that set it can still be running), then replaces it.
func testOrphanIdentityMarker(t *testing.T, k *cluster) {
	ctx := context.Background()
	ns := k.namespace(t)
	var clock storetest.Clock
	clock.Set(time.Now())
	s := k.store(t, k.admin, ns, clock.Now)
	cut := storetest.Record(storetest.ID(1), "worker-1", storetest.T0)
	// The cut-off call: its marker, nothing else.
	if _, _, err := s.setMarker(ctx, IdentityMarkerKey(cut.Identity), store.Never, cut.ID); err != nil {
		t.Fatal(err)
	}
	other := storetest.Record(storetest.ID(2), "worker-1", storetest.T0)
	other.Identity = cut.Identity
	if err := s.Enrol(ctx, other, store.EnrolOptions{}); !errors.Is(err, store.ErrIdentityEnrolled) {
		t.Fatalf("another enrolment beside a fresh marker: %v, want ErrIdentityEnrolled", err)
	}
	clock.Set(time.Now().Add(OrphanAge + time.Minute))
	if err := s.Enrol(ctx, other, store.EnrolOptions{}); err != nil {
		t.Fatalf("another enrolment beside an orphaned marker: %v", err)
	}
	if b, err := s.BindingOf(ctx, cut.Identity); err != nil || b.RecordID != other.ID {
		t.Fatalf("binding = %+v, %v; want record %s", b, err, other.ID)
	}

	// The same enrolment retried completes a cut-off call at once.
	ns2 := k.namespace(t)
	s2 := k.store(t, k.admin, ns2, time.Now)
	if _, _, err := s2.setMarker(ctx, IdentityMarkerKey(cut.Identity), store.Never, cut.ID); err != nil {
		t.Fatal(err)
	}
	if err := s2.Enrol(ctx, cut, store.EnrolOptions{}); err != nil {
		t.Fatalf("the cut-off enrolment retried: %v", err)
	}
	if b, err := s2.Binding(ctx, "worker-1"); err != nil || b.RecordID != cut.ID {
		t.Fatalf("binding = %+v, %v; want record %s", b, err, cut.ID)
	}
}
