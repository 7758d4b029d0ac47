package cluster_test

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/mcs/tokens"
)

type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) Add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

// TestTokenSecret keeps provisioning tokens in openshift-config/
// machineconfig-auth on a real kube-apiserver: made when missing, the
// seed's hand-made form read, rotation with grace, a hand replacement
// honoured, and a Secret with the wrong keys refused by name.
func TestTokenSecret(t *testing.T) {
	cfg := clustertest.Start(t)
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ns := range []string{"made", "seed", "wrong"} {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	clk := &testClock{now: time.Now()}
	const grace = time.Hour
	secret := func(t *testing.T, ns string) *corev1.Secret {
		t.Helper()
		s, err := kc.CoreV1().Secrets(ns).Get(ctx, cluster.TokenSecretName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	t.Run("made when missing, rotated with grace", func(t *testing.T) {
		if _, err := tokens.Open(ctx, &cluster.TokenSecret{Client: kc, Namespace: "made"}, grace, clk.Now, false); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("missing Secret without create: %v, want fs.ErrNotExist", err)
		}
		p, err := tokens.Open(ctx, &cluster.TokenSecret{Client: kc, Namespace: "made"}, grace, clk.Now, true)
		if err != nil {
			t.Fatal(err)
		}
		first := p.Current()
		if got := string(secret(t, "made").Data[cluster.TokenKey]); got != first {
			t.Fatalf("Secret's token %q, want the current %q", got, first)
		}
		clk.Add(time.Minute)
		if err := p.Rotate(); err != nil {
			t.Fatal(err)
		}
		// Another replica reads the same list.
		q, err := tokens.Open(ctx, &cluster.TokenSecret{Client: kc, Namespace: "made"}, grace, clk.Now, false)
		if err != nil {
			t.Fatal(err)
		}
		if q.Current() == first || q.Current() != p.Current() || !q.Check(first) || !q.Check(p.Current()) {
			t.Fatalf("after a rotation a replica has current %q (leader %q) and accepts the first: %v", q.Current(), p.Current(), q.Check(first))
		}
		if got := p.Published(10 * time.Second); got != first {
			t.Errorf("published right after the rotation: %q, want the previous token until it settles", got)
		}
		clk.Add(11 * time.Second)
		if got := p.Published(10 * time.Second); got != p.Current() {
			t.Errorf("published after settling: %q, want the current token", got)
		}
		clk.Add(grace)
		if q.Check(first) {
			t.Error("the first token is still accepted past its grace")
		}
	})

	t.Run("the seed's hand-made Secret, then replaced by hand", func(t *testing.T) {
		// dd if=/dev/urandom bs=32 count=1 | base64 > token: a newline ends it.
		const seedTok = "c2VlZHRva2VuLXNlZWR0b2tlbi1zZWVkdG9rZW4tc2VlZA=="
		if _, err := kc.CoreV1().Secrets("seed").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: cluster.TokenSecretName},
			Data: map[string][]byte{"token": []byte(seedTok + "\n")}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The Secret's times are the API server's: this clock is the wall's.
		p, err := tokens.Open(ctx, &cluster.TokenSecret{Client: kc, Namespace: "seed"}, grace, time.Now, false)
		if err != nil {
			t.Fatal(err)
		}
		if p.Current() != seedTok || !p.Check(seedTok) {
			t.Fatalf("current %q, want the seed's token without its newline", p.Current())
		}
		if err := p.Rotate(); err != nil {
			t.Fatal(err)
		}
		rotated := p.Current()
		s := secret(t, "seed")
		s.Data["token"] = []byte("aGFuZC1zZXQ=")
		if _, err := kc.CoreV1().Secrets("seed").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if changed, err := p.Reload(); err != nil || !changed {
			t.Fatalf("reload after a hand replacement: changed %v, %v", changed, err)
		}
		if p.Current() != "aGFuZC1zZXQ=" || !p.Check(rotated) || !p.Check(seedTok) {
			t.Fatalf("after a hand replacement: current %q, the rotated one accepted %v, the seed's %v", p.Current(), p.Check(rotated), p.Check(seedTok))
		}
	})

	t.Run("wrong keys are refused by name, the last good tokens kept", func(t *testing.T) {
		if _, err := kc.CoreV1().Secrets("wrong").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: cluster.TokenSecretName},
			Data: map[string][]byte{"token": []byte("Z29vZA==")}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p, err := tokens.Open(ctx, &cluster.TokenSecret{Client: kc, Namespace: "wrong"}, grace, clk.Now, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			data map[string][]byte
			want []string
		}{
			{"no token key", map[string][]byte{"Token": []byte("x"), "password": []byte("y")}, []string{"Secret wrong/machineconfig-auth", `no key "token"`, "Token, password"}},
			{"empty token", map[string][]byte{"token": []byte("\n")}, []string{`Secret wrong/machineconfig-auth key "token"`, "empty"}},
			{"token with spaces", map[string][]byte{"token": []byte("a b")}, []string{`key "token"`, "printable"}},
			{"history not JSON", map[string][]byte{"token": []byte("Z29vZA=="), "tokens.json": []byte("{")}, []string{`key "tokens.json" does not parse`}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				s := secret(t, "wrong")
				s.Data = tc.data
				if _, err := kc.CoreV1().Secrets("wrong").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				_, err := p.Reload()
				if err == nil {
					t.Fatal("accepted")
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				if p.Current() != "Z29vZA==" || !p.Check("Z29vZA==") {
					t.Errorf("the last good token was dropped: current %q", p.Current())
				}
			})
		}
	})
}
