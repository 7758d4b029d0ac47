package fleet

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/nodeproof/nodeproof/store/kubestore"
)

// Approvals watches CSRs: when each was first seen approved, or why it
// was denied.
type Approvals struct {
	mu       sync.Mutex
	approved map[string]time.Time
	denied   map[string]string
}

// WatchApprovals starts watching until ctx ends; it returns once the
// watch has synced.
func (w *World) WatchApprovals(ctx context.Context) *Approvals {
	a := &Approvals{approved: map[string]time.Time{}, denied: map[string]string{}}
	factory := informers.NewSharedInformerFactory(w.KC, 0)
	inf := factory.Certificates().V1().CertificateSigningRequests().Informer()
	seen := func(obj any) {
		o, ok := obj.(*certv1.CertificateSigningRequest)
		if !ok {
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, c := range o.Status.Conditions {
			switch c.Type {
			case certv1.CertificateApproved:
				if _, ok := a.approved[o.Name]; !ok {
					a.approved[o.Name] = time.Now()
				}
			case certv1.CertificateDenied:
				a.denied[o.Name] = c.Reason + ": " + c.Message
			}
		}
	}
	inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, o any) { seen(o) }})
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	return a
}

// Approved says when CSR name was first seen approved.
func (a *Approvals) Approved(name string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.approved[name]
	return t, ok
}

// Denied says why CSR name was denied.
func (a *Approvals) Denied(name string) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	why, ok := a.denied[name]
	return why, ok
}

// WaitAll waits until every machine with a CSR has it approved or denied,
// or timeout, and returns how many were approved. Call it once the
// machines have finished provisioning: one without a CSR by then never
// gets one.
func (a *Approvals) WaitAll(ms []*Machine, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for {
		approved, pending := 0, 0
		for _, m := range ms {
			if m.CSRName == "" {
				continue
			}
			if _, ok := a.Approved(m.CSRName); ok {
				approved++
			} else if _, ok := a.Denied(m.CSRName); !ok {
				pending++
			}
		}
		if pending == 0 || time.Now().After(deadline) {
			return approved
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Audit is what the store and the API server say happened, afterwards.
type Audit struct {
	// Duplicated: a CSR approved twice, or a record that approved more
	// than one CSR.
	Duplicated int
	// Lost: a machine that got a config token whose CSR is not approved,
	// or approved without its record consumed by it; or a record a
	// machine was given that is not in the store.
	Lost int
	// Problems names each.
	Problems []string
}

// Audit checks every CSR and every machine's record: each approved CSR
// approved once, by a record consumed once and by it; each machine that
// was given a record has it in the store, consumed by its own CSR.
func (w *World) Audit(ctx context.Context, ms []*Machine) (Audit, error) {
	var out Audit
	csrs, err := w.KC.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		return out, err
	}
	perRecord := map[string][]string{}
	approved := map[string]bool{}
	for _, c := range csrs.Items {
		n := 0
		for _, cond := range c.Status.Conditions {
			if cond.Type != certv1.CertificateApproved {
				continue
			}
			n++
			if i := strings.Index(cond.Message, "NodeAttestation "); i >= 0 {
				rec := strings.Fields(cond.Message[i+len("NodeAttestation "):])[0]
				perRecord[rec] = append(perRecord[rec], c.Name)
			}
		}
		if n > 1 {
			out.Duplicated++
			out.Problems = append(out.Problems, fmt.Sprintf("CSR %s approved %d times", c.Name, n))
		}
		approved[c.Name] = n > 0
	}
	for rec, names := range perRecord {
		if len(names) > 1 {
			out.Duplicated += len(names) - 1
			out.Problems = append(out.Problems, fmt.Sprintf("record %s approved %v", rec, names))
		}
	}
	cl, err := kubestore.NewClient(w.Config)
	if err != nil {
		return out, err
	}
	st, err := kubestore.New(cl, "nodeproof", time.Now)
	if err != nil {
		return out, err
	}
	for _, m := range ms {
		if m.Record == "" {
			continue // never attested: an error of its own
		}
		r, err := st.GetRecord(ctx, m.Record)
		switch {
		case err != nil:
			out.Lost++
			out.Problems = append(out.Problems, fmt.Sprintf("%s: record %s: %v", m.Name, m.Record, short(err)))
		case m.CSRName == "":
			out.Lost++
			out.Problems = append(out.Problems, fmt.Sprintf("%s: attested, no CSR", m.Name))
		case !approved[m.CSRName]:
			out.Lost++
			out.Problems = append(out.Problems, fmt.Sprintf("%s: CSR %s not approved", m.Name, m.CSRName))
		case r.ConsumedAt == nil || !strings.HasPrefix(r.ConsumedBy, m.CSRName+"/"):
			// The machine's CSR may have been approved with an earlier
			// record of its own (it attested again after a crash): fine if
			// that record was consumed by its CSR.
			if !consumedByAny(ctx, st, m) {
				out.Lost++
				out.Problems = append(out.Problems, fmt.Sprintf("%s: CSR %s approved without its record consumed by it", m.Name, m.CSRName))
			}
		}
	}
	return out, nil
}

// consumedByAny reports whether one of m's node's records was consumed by
// m's CSR.
func consumedByAny(ctx context.Context, st *kubestore.Store, m *Machine) bool {
	recs, err := st.RecordsForNode(ctx, m.NodeName)
	if err != nil {
		return false
	}
	for _, r := range recs {
		if r.ConsumedAt != nil && strings.HasPrefix(r.ConsumedBy, m.CSRName+"/") {
			return true
		}
	}
	return false
}
