package approver

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// beforeTaintPatch runs change once, just before the first JSON patch
// (the taint's) of Node name goes to the API server: another writer
// changing the Node between the node controller's read and its write.
type beforeTaintPatch struct {
	next   http.RoundTripper
	name   string
	change func() error
	done   atomic.Bool
	err    error
}

func (b *beforeTaintPatch) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPatch && r.URL.Path == "/api/v1/nodes/"+b.name &&
		r.Header.Get("Content-Type") == string(types.JSONPatchType) && b.done.CompareAndSwap(false, true) {
		b.err = b.change()
	}
	return b.next.RoundTrip(r)
}

// TestNodeChangedMeanwhile: when another writer changes a Node between
// the node controller's read and its taint patch, the patch's test of the
// resourceVersion fails (the API server answers 422); the controller logs
// that at info level, not as an error, judges the node again and
// converges: its taint is set and the other writer's change is kept.
func TestNodeChangedMeanwhile(t *testing.T) {
	cfg := kubetest.Start(t, "../deploy/crds")
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kubestore.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kubestore.New(cl, "nodeproof", time.Now)
	if err != nil {
		t.Fatal(err)
	}
	bindings, err := kubestore.NewCached(cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go bindings.Start(ctx)
	if !bindings.WaitForSync(ctx) {
		t.Fatal("the binding watch did not sync")
	}

	for _, tc := range []struct {
		name   string
		change func(n *corev1.Node)
		kept   func(n *corev1.Node) bool
	}{
		{name: "a taint added",
			change: func(n *corev1.Node) {
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "example.com/maintenance", Effect: corev1.TaintEffectNoSchedule})
			},
			kept: func(n *corev1.Node) bool {
				return taint(n, "example.com/maintenance") == corev1.TaintEffectNoSchedule
			}},
		{name: "a label changed",
			change: func(n *corev1.Node) { n.Labels = map[string]string{"example.com/rack": "r7"} },
			kept:   func(n *corev1.Node) bool { return n.Labels["example.com/rack"] == "r7" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "worker-" + strings.ReplaceAll(tc.name, " ", "-")
			// A node that carries the Attested condition but has no binding
			// and no history (a binding deleted by hand): the controller
			// judges it unattested, NoExecute, and taints it.
			n, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			n.Status.Conditions = []corev1.NodeCondition{{Type: ConditionAttested, Status: corev1.ConditionTrue, Reason: "NodeproofAttested", Message: "earlier"}}
			if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}

			hook := &beforeTaintPatch{name: name, change: func() error {
				n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				tc.change(n)
				_, err = admin.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
				return err
			}}
			ccfg := rest.CopyConfig(cfg)
			ccfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { hook.next = rt; return hook })
			kc, err := kubernetes.NewForConfig(ccfg)
			if err != nil {
				t.Fatal(err)
			}
			logs := new(testenv.LockedBuffer)
			nc, err := NewNodeController(NodeOptions{Client: kc, EventClient: admin, Bindings: bindings, Clock: time.Now,
				Log: slog.New(slog.NewJSONHandler(logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			rctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- nc.Run(rctx) }()

			deadline := time.Now().Add(30 * time.Second)
			for {
				n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if taint(n, TaintUnattested) == corev1.TaintEffectNoExecute && tc.kept(n) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the node did not converge: taints %v, labels %v\nlog:\n%s", n.Spec.Taints, n.Labels, logs)
				}
				time.Sleep(100 * time.Millisecond)
			}
			stop()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if !hook.done.Load() || hook.err != nil {
				t.Fatalf("the concurrent change: made %v, err %v", hook.done.Load(), hook.err)
			}
			conflicts := 0
			for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
				var l struct{ Level, Msg, Node, Err string }
				if err := json.Unmarshal([]byte(line), &l); err != nil {
					t.Fatalf("log line %q: %v", line, err)
				}
				switch {
				case l.Level == "ERROR":
					t.Errorf("logged an error: %s", line)
				case l.Msg == "node changed meanwhile, judged again" && l.Level == "INFO" && l.Node == name:
					conflicts++
					if !strings.Contains(l.Err, errNodeChanged.Error()) {
						t.Errorf("the conflict's line does not say the node changed: %s", line)
					}
				}
			}
			if conflicts == 0 {
				t.Errorf("no info line for the conflict:\n%s", logs)
			}
		})
	}
}

// taint is the effect of n's taint key, "" for none.
func taint(n *corev1.Node, key string) corev1.TaintEffect {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return t.Effect
		}
	}
	return ""
}
