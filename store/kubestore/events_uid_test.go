package kubestore

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/storetest"
)

// testBindingEvents: the server's Events (BindingEvents' decisions and
// reports, with the uids of the binding watch) and a command's
// (WriteEvent, with the uid Binding reads) name the NodeBinding's uid, so the
// real `kubectl describe nodebinding` lists them under Events; an Event
// about a name with no binding still reaches `kubectl get events`.
func testBindingEvents(t *testing.T, k *cluster) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc, err := NewClient(k.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := k.namespace(t)
	now := time.Now().Truncate(time.Second)
	st := k.store(t, sc, ns, time.Now)
	if err := st.Enrol(ctx, storetest.Record(storetest.ID(1), "worker-1", now), store.EnrolOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := NewWatched(k.cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	go w.Start(ctx)
	waitFor(t, "the watch to sync", w.Trusted)
	b, err := st.Binding(ctx, "worker-1")
	if err != nil || b.UID == "" {
		t.Fatalf("the binding's uid: %+v, %v", b, err)
	}
	uid := types.UID(b.UID)
	if got := w.UID("worker-1"); got != uid {
		t.Fatalf("the watch's uid %q, the API server's %q", got, uid)
	}
	if got := w.UID("worker-9"); got != "" {
		t.Fatalf("uid of a name without a binding: %q", got)
	}
	kc, err := kubernetes.NewForConfig(k.cfg)
	if err != nil {
		t.Fatal(err)
	}
	be := NewBindingEvents(kc, kc, ns, "nodeproof-server")
	be.UIDs(w.UID)
	defer be.Close()
	be.Decision("tpm-ek:other", "worker-1", true, "NodeNameTaken", "tpm-ek:other asked for node worker-1; refused")
	be.Report("worker-1", "AttestationFailed", "worker-1 reports a failure")
	be.Report("worker-9", "EnrolmentFailed", "a machine that never enrolled reported a failure")
	if err := WriteEvent(ctx, kc, ns, "nodeproof-revoke", BindingEvent{NodeName: "worker-1", Reason: "Revoked", Message: "node worker-1 revoked", Warning: true, Time: now, UID: uid}); err != nil {
		t.Fatal(err)
	}

	kubeconfig := clustertest.AdminKubeconfig(t, k.cfg)
	kubectl := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, testenv.Kubectl(t), append([]string{"--kubeconfig", kubeconfig, "-n", ns}, args...)...)
		cmd.Env = []string{"HOME=" + t.TempDir(), "PATH=" + os.Getenv("PATH")}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out.String())
		}
		return out.String()
	}
	// The recorder sends in the background: poll, with kubectl's pace.
	eventually := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(300 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("waited a minute for %s", what)
			}
		}
	}
	eventually("kubectl describe nodebinding worker-1 to list its three Events", func() bool {
		out := kubectl("describe", "nodebinding", "worker-1")
		_, events, _ := strings.Cut(out, "Events:")
		return strings.Contains(events, "NodeNameTaken") && strings.Contains(events, "AttestationFailed") && strings.Contains(events, "Revoked")
	})
	eventually("kubectl get events to list the Event of a name without a binding", func() bool {
		return strings.Contains(kubectl("get", "events"), "EnrolmentFailed")
	})
}
