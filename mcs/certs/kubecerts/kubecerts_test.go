package kubecerts_test

import (
	"context"
	"crypto/x509"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/certs/kubecerts"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/pemcert"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time     { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Set(t time.Time)    { c.mu.Lock(); defer c.mu.Unlock(); c.now = t }
func years(y float64) time.Duration { return time.Duration(y * 365.25 * 24 * float64(time.Hour)) }

// env is a real kube-apiserver with the MCO namespace, shared by the tests.
func env(t *testing.T) kubernetes.Interface {
	t.Helper()
	cfg := clustertest.Start(t)
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

func namespace(t *testing.T, kc kubernetes.Interface, name string) {
	t.Helper()
	if _, err := kc.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// verifies reports whether a client trusting bundle accepts snap's
// serving chain at now (as Ignition's crypto/tls would).
func verifies(t *testing.T, bundle []byte, snap *kubecerts.Snapshot, now time.Time) error {
	t.Helper()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		t.Fatal("bundle has no certificate")
	}
	chain, err := pemcert.Parse(snap.ChainPEM)
	if err != nil {
		t.Fatal(err)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err = chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now, DNSName: "api-int.example.com",
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}

func count(b []byte) int { return strings.Count(string(b), "BEGIN CERTIFICATE") }

func TestKeeper(t *testing.T) {
	kc := env(t)
	ctx := context.Background()

	t.Run("lifetime 0 to 8 to 10 years", func(t *testing.T) {
		namespace(t, kc, "life")
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		clk := &clock{now: t0}
		k, err := kubecerts.New(kubecerts.Options{Client: kc, Namespace: "life", Hosts: []string{"api-int.example.com"}, Clock: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := k.Read(ctx); err != kubecerts.ErrAbsent {
			t.Fatalf("before the first Ensure: %v, want ErrAbsent", err)
		}
		s0, changes, err := k.Ensure(ctx, false)
		if err != nil || !s0.Owned || count(s0.BundlePEM) != 1 || len(changes) == 0 {
			t.Fatalf("first Ensure: owned %v, %d CAs, changes %q, %v", s0 != nil && s0.Owned, count(s0.BundlePEM), changes, err)
		}
		sec, err := kc.CoreV1().Secrets("life").Get(ctx, kubecerts.CAName, metav1.GetOptions{})
		if err != nil || sec.Type != corev1.SecretTypeTLS || len(sec.Data[corev1.TLSPrivateKeyKey]) == 0 {
			t.Fatalf("CA Secret: %v, %+v", err, sec)
		}
		// A second pass changes nothing, not even a resourceVersion.
		again, changes, err := k.Ensure(ctx, false)
		if err != nil || len(changes) != 0 || again.Version != s0.Version {
			t.Fatalf("idempotent Ensure: changes %q, version %s→%s, %v", changes, s0.Version, again.Version, err)
		}
		if err := verifies(t, s0.BundlePEM, s0, t0); err != nil {
			t.Fatalf("year 0: %v", err)
		}

		// Year 8.1: the CA is past 80%; a new one joins the bundle, the
		// old stays, and both old and new pointer configs verify.
		t8 := t0.Add(years(8.1))
		clk.Set(t8)
		s8, changes, err := k.Ensure(ctx, false)
		if err != nil || count(s8.BundlePEM) != 2 || len(changes) == 0 {
			t.Fatalf("year 8.1: %d CAs, changes %q, %v", count(s8.BundlePEM), changes, err)
		}
		follower, err := k.Read(ctx)
		if err != nil || follower.Version != s8.Version {
			t.Fatalf("a follower reads %v, %v; want the leader's version %s", follower, err, s8.Version)
		}
		for name, b := range map[string][]byte{"year-0 bundle": s0.BundlePEM, "year-8 bundle": s8.BundlePEM} {
			if err := verifies(t, b, s8, t8); err != nil {
				t.Errorf("year 8.1, a machine with the %s: %v", name, err)
			}
		}
		if err := verifies(t, s0.BundlePEM, s0, t8); err != nil {
			t.Errorf("year 8.1, the previous serving certificate with the new bundle: %v", err)
		}

		// Year 10.1: the first CA expired and leaves the bundle.
		t10 := t0.Add(years(10.1))
		clk.Set(t10)
		s10, _, err := k.Ensure(ctx, false)
		if err != nil || count(s10.BundlePEM) != 1 {
			t.Fatalf("year 10.1: %d CAs, %v", count(s10.BundlePEM), err)
		}
		if err := verifies(t, s8.BundlePEM, s10, t10); err != nil {
			t.Errorf("year 10.1, a machine with the year-8 bundle: %v", err)
		}
		if err := verifies(t, s10.BundlePEM, s10, t10); err != nil {
			t.Errorf("year 10.1, a machine with the year-10 bundle: %v", err)
		}
	})

	t.Run("refusals name the object and key", func(t *testing.T) {
		for _, tc := range []struct {
			name     string
			spoil    func(t *testing.T, ns string)
			ensure   bool // refused by Ensure (the leader) rather than Read
			wantErrs []string
		}{
			{"CA Secret's key is not a key", func(t *testing.T, ns string) {
				patchSecret(t, kc, ns, kubecerts.CAName, corev1.TLSPrivateKeyKey, []byte("not a key"))
			}, true, []string{"Secret " + "%s/machine-config-server-ca key tls.key"}},
			{"CA Secret's certificate is garbage", func(t *testing.T, ns string) {
				patchSecret(t, kc, ns, kubecerts.CAName, corev1.TLSCertKey, []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
			}, true, []string{"Secret %s/machine-config-server-ca key tls.crt"}},
			{"bundle lacks the serving certificate's issuer", func(t *testing.T, ns string) {
				other, _, err := certs.Next(nil, func(n string) string { return n }, "", certs.Options{Clock: time.Now, Hosts: []string{"x.example.com"}})
				if err != nil {
					t.Fatal(err)
				}
				patchBundle(t, kc, ns, other[certs.CABundleFileName])
			}, false, []string{"ConfigMap %s/machine-config-server-ca key ca-bundle.crt", "issuer"}},
			{"bundle is not PEM", func(t *testing.T, ns string) {
				patchBundle(t, kc, ns, []byte("hello"))
			}, false, []string{"ConfigMap %s/machine-config-server-ca key ca-bundle.crt"}},
			{"serving key does not match", func(t *testing.T, ns string) {
				ca, err := kc.CoreV1().Secrets(ns).Get(ctx, kubecerts.CAName, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				patchSecret(t, kc, ns, kubecerts.ServingName, corev1.TLSPrivateKeyKey, ca.Data[corev1.TLSPrivateKeyKey])
			}, false, []string{"Secret %s/machine-config-server-tls key tls.crt and tls.key"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ns := strings.ReplaceAll(strings.ToLower(tc.name), " ", "-")
				ns = strings.ReplaceAll(ns, "'", "")
				namespace(t, kc, ns)
				clk := &clock{now: time.Now()}
				k, err := kubecerts.New(kubecerts.Options{Client: kc, Namespace: ns, Hosts: []string{"api-int.example.com"}, Clock: clk.Now})
				if err != nil {
					t.Fatal(err)
				}
				if _, _, err := k.Ensure(ctx, false); err != nil {
					t.Fatal(err)
				}
				tc.spoil(t, ns)
				var got error
				if tc.ensure {
					_, _, got = k.Ensure(ctx, false)
				} else {
					_, got = k.Read(ctx)
				}
				if got == nil {
					t.Fatal("accepted")
				}
				for _, w := range tc.wantErrs {
					if w = strings.ReplaceAll(w, "%s", ns); !strings.Contains(got.Error(), w) {
						t.Errorf("error %q does not name %q", got, w)
					}
				}
			})
		}
	})

	t.Run("objects the MCO owns are served and never written", func(t *testing.T) {
		const ns = "mco-owned"
		namespace(t, kc, ns)
		now := time.Now()
		files, _, err := certs.Next(nil, func(n string) string { return n }, "", certs.Options{Clock: func() time.Time { return now.Add(-years(9)) }, Hosts: []string{"api-int.example.com"}})
		if err != nil {
			t.Fatal(err)
		}
		// As the MCO makes them: no nodeproof label, a CA 9 years old.
		if _, err := kc.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: kubecerts.CAName},
			Data: map[string]string{kubecerts.BundleKey: string(files[certs.CABundleFileName])}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string]map[string][]byte{
			kubecerts.CAName:      {corev1.TLSCertKey: files[certs.CACertFileName], corev1.TLSPrivateKeyKey: files[certs.CAKeyFileName]},
			kubecerts.ServingName: {corev1.TLSCertKey: files[certs.ServingCertFileName], corev1.TLSPrivateKeyKey: files[certs.ServingKeyFileName]},
		} {
			if _, err := kc.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Type: corev1.SecretTypeTLS, Data: data}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		k, err := kubecerts.New(kubecerts.Options{Client: kc, Namespace: ns, Hosts: []string{"api-int.example.com"}, Clock: time.Now})
		if err != nil {
			t.Fatal(err)
		}
		before, err := k.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		snap, changes, err := k.Ensure(ctx, false)
		if err != nil || snap.Owned || len(changes) != 0 || snap.Version != before.Version {
			t.Fatalf("Ensure on the MCO's objects: owned %v, changes %q, version %s→%s, %v", snap != nil && snap.Owned, changes, before.Version, snap.Version, err)
		}
		// Asked to rotate them (nodeproof ca rotate), it says whose they are.
		if _, _, err := k.Ensure(ctx, true); err == nil || !strings.Contains(err.Error(), "its owner rotates it") {
			t.Fatalf("a rotation of the MCO's CA: %v", err)
		}
		if _, _, err := k.RotateServing(ctx); err == nil {
			t.Fatal("a serving rotation of the MCO's objects was accepted")
		}
		if after, err := k.Read(ctx); err != nil || after.Version != before.Version {
			t.Fatalf("the MCO's objects changed: %v", err)
		}
	})
}

func patchSecret(t *testing.T, kc kubernetes.Interface, ns, name, key string, v []byte) {
	t.Helper()
	ctx := context.Background()
	s, err := kc.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Data[key] = v
	if _, err := kc.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func patchBundle(t *testing.T, kc kubernetes.Interface, ns string, b []byte) {
	t.Helper()
	ctx := context.Background()
	cm, err := kc.CoreV1().ConfigMaps(ns).Get(ctx, kubecerts.CAName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data[kubecerts.BundleKey] = string(b)
	if _, err := kc.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
