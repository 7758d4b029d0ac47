package approver

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	certlisters "k8s.io/client-go/listers/certificates/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// Defaults of Options.
const (
	DefaultWorkers      = 16 // measured: 67 → 99 CSRs/s on 2 cores (bench/approver)
	DefaultPerNodeRate  = 2  // decisions per second per requester (Decider.LimitKey)
	DefaultPerNodeBurst = 5
	DefaultResync       = 30 * time.Second
	// maxLimiters bounds the limiter table; idle limiters are dropped
	// beyond it.
	maxLimiters = 10000
	// issuedIndex indexes cached CSRs by the SHA-256 of the certificate
	// issued for them (hex), to find the CSR whose certificate made a
	// renewal.
	issuedIndex = "issuedSHA256"
	// callTimeout bounds each API call a worker makes.
	callTimeout = 15 * time.Second
)

// Options configure a Controller.
type Options struct {
	// Client reads CSRs and writes approvals. Its identity needs the RBAC
	// in deploy/approver (approve on the two kubelet signers only). Mind
	// its rate limit: client-go's default (5/s) holds the approver to
	// about 2.5 CSRs a second.
	Client kubernetes.Interface
	// EventClient posts events (default Client). A client of its own keeps
	// events from spending the approvals' rate limit.
	EventClient kubernetes.Interface
	// Decider decides each CSR (required).
	Decider *Decider
	// Workers decide CSRs in parallel (default DefaultWorkers).
	Workers int
	// PerNodeRate and PerNodeBurst bound how often the CSRs of one
	// requester are decided (Decider.LimitKey: a node's own credentials, a
	// bootstrap token issued for one node; a requester many machines share
	// together with the node name it asks for): a flood from one machine,
	// whatever names it asks for, delays only that machine's CSRs. A
	// postponed CSR keeps its place (a reservation), so a flood is looked
	// at once per CSR, not again and again. There is no global breaker.
	PerNodeRate  rate.Limit
	PerNodeBurst int
	// Resync re-examines pending CSRs this often, so one left pending
	// because its record had not been written yet is approved once it is
	// (default DefaultResync). The pending gauge is recounted every Resync
	// or 10 s, whichever is shorter.
	Resync time.Duration
	// Metrics, if set, receives decisions, the pending count and latencies.
	Metrics *Metrics
	// Clock tells the time (required).
	Clock func() time.Time
	// Log gets one line per decision (required).
	Log *slog.Logger
}

// Controller approves kubelet CSRs with evidence: client-go informers on
// certificates.k8s.io/v1 CSRs, a rate-limited work queue, Workers
// goroutines. Run it under leader election (package leader) when several
// replicas run.
type Controller struct {
	o        Options
	queue    workqueue.TypedRateLimitingInterface[string]
	lister   certlisters.CertificateSigningRequestLister
	recorder record.EventRecorder

	indexer toolscache.Indexer

	mu       sync.Mutex
	limiters map[string]*rate.Limiter
	// left remembers which reason a pending CSR was last left with, so a
	// resync does not repeat the event.
	left map[string]attest.Reason
	// turns are the times postponed CSRs were given by their limiter.
	turns map[string]time.Time
	// recorded names the issued CSRs (name → UID) whose certificate
	// RecordIssued has seen this term.
	recorded map[string]string
}

// New checks o.
func New(o Options) (*Controller, error) {
	switch {
	case o.Client == nil || o.Decider == nil:
		return nil, errors.New("approver: Client and Decider are required")
	case o.Clock == nil || o.Log == nil:
		return nil, errors.New("approver: Clock and Log are required")
	}
	if o.Decider.Lineages == nil {
		return nil, errors.New("approver: the Decider's Lineages (the certificate lineages) are required")
	}
	if o.Decider.Fresh != nil && o.Decider.FreshLineages == nil {
		return nil, errors.New("approver: with the Decider's Fresh store, its FreshLineages are required")
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	if o.PerNodeRate <= 0 {
		o.PerNodeRate = DefaultPerNodeRate
	}
	if o.PerNodeBurst <= 0 {
		o.PerNodeBurst = DefaultPerNodeBurst
	}
	if o.Resync <= 0 {
		o.Resync = DefaultResync
	}
	return &Controller{o: o, limiters: map[string]*rate.Limiter{}, left: map[string]attest.Reason{},
		turns: map[string]time.Time{}, recorded: map[string]string{}}, nil
}

// pending reports whether csr has no Approved, Denied or Failed condition.
func pending(csr *certv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		switch c.Type {
		case certv1.CertificateApproved, certv1.CertificateDenied, certv1.CertificateFailed:
			return false
		}
	}
	return true
}

func ours(csr *certv1.CertificateSigningRequest) bool {
	return csr.Spec.SignerName == SignerKubeletClient || csr.Spec.SignerName == SignerKubeletServing
}

// issued reports whether csr is a kubelet client CSR with a certificate.
func issued(csr *certv1.CertificateSigningRequest) bool {
	return csr.Spec.SignerName == SignerKubeletClient && len(csr.Status.Certificate) > 0
}

// Run decides CSRs until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactory(c.o.Client, c.o.Resync)
	inf := factory.Certificates().V1().CertificateSigningRequests()
	c.lister = inf.Lister()
	if err := inf.Informer().AddIndexers(toolscache.Indexers{issuedIndex: func(obj any) ([]string, error) {
		csr, ok := obj.(*certv1.CertificateSigningRequest)
		if !ok || !issued(csr) {
			return nil, nil
		}
		if sum := IssuedSHA256(csr); sum != nil {
			return []string{hex.EncodeToString(sum)}, nil
		}
		return nil, nil
	}}); err != nil {
		return fmt.Errorf("approver: %w", err)
	}
	c.indexer = inf.Informer().GetIndexer()
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodeproof-approver"})
	defer c.queue.ShutDown()

	// Pending CSRs are decided; issued client CSRs are recorded in their
	// node's lineage, once a term.
	enqueue := func(obj any) {
		csr, ok := obj.(*certv1.CertificateSigningRequest)
		if ok && ours(csr) && (pending(csr) || issued(csr) && !c.wasRecorded(csr)) {
			c.queue.Add(csr.Name)
		}
	}
	if _, err := inf.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if csr, ok := obj.(*certv1.CertificateSigningRequest); ok {
				c.forget(csr.Name)
			}
		},
	}); err != nil {
		return fmt.Errorf("approver: %w", err)
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	events := c.o.EventClient
	if events == nil {
		events = c.o.Client
	}
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: events.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	// Events carry a CSR's names (the requester's to choose): safetext.
	c.recorder = kubestore.SafeRecorder(broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "nodeproof-approver"}))

	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("approver: CSR informer did not sync")
	}
	c.o.Log.Info("approver running", "workers", c.o.Workers)

	var wg sync.WaitGroup
	for range c.o.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c.next(ctx) {
			}
		}()
	}
	// The pending gauge is recounted from the cache this often.
	tick := time.NewTicker(min(10*time.Second, c.o.Resync))
	defer tick.Stop()
	c.countPending()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
			c.countPending()
			c.pruneLimiters()
		}
	}
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

func (c *Controller) countPending() {
	if c.o.Metrics == nil {
		return
	}
	all, err := c.lister.List(labelsEverything)
	if err != nil {
		return
	}
	n := 0
	for _, csr := range all {
		if ours(csr) && pending(csr) {
			n++
		}
	}
	c.o.Metrics.pending.Set(float64(n))
}

// next handles one queued CSR name; false when the queue shut down.
func (c *Controller) next(ctx context.Context) bool {
	name, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(name)
	retry, err := c.handle(ctx, name)
	switch {
	case err != nil:
		c.o.Log.Error("csr", "csr", name, "err", err.Error())
		c.queue.AddRateLimited(name)
	case retry > 0:
		c.queue.AddAfter(name, retry)
	default:
		c.queue.Forget(name)
	}
	return true
}

// handle decides one pending CSR, or records the certificate issued for
// one; a positive duration asks to come back later.
func (c *Controller) handle(ctx context.Context, name string) (time.Duration, error) {
	csr, err := c.lister.Get(name)
	if apierrors.IsNotFound(err) {
		c.forget(name)
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if !ours(csr) {
		c.forget(name)
		return 0, nil
	}
	if !pending(csr) {
		c.forgetLeft(name)
		if !issued(csr) || c.wasRecorded(csr) {
			return 0, nil
		}
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		return 0, c.record(ctx, csr)
	}
	if wait := c.admit(ctx, csr); wait > 0 {
		return wait, nil
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := c.catchUp(ctx, csr); err != nil {
		return 0, err
	}
	dec, err := c.o.Decider.Decide(ctx, csr)
	if err != nil {
		return 0, err
	}
	log := c.o.Log.With("csr", csr.Name, "node", dec.NodeName, "requester", csr.Spec.Username,
		"signer", csr.Spec.SignerName, "action", string(dec.Action), "reason", string(dec.Reason), "record", dec.Record)
	if dec.Action == Leave {
		if dec.Reason != attest.ReasonNotKubelet && c.leftChanged(csr.Name, dec.Reason) {
			c.recorder.Event(csr, corev1.EventTypeWarning, string(dec.Reason), "nodeproof: left pending: "+dec.Message)
			c.observe(csr, dec)
			log.Info("csr left pending", "detail", dec.Message)
		}
		return 0, nil
	}
	if err := c.write(ctx, csr, dec); err != nil {
		return 0, fmt.Errorf("write %s: %w", dec.Action, err)
	}
	c.forgetLeft(csr.Name)
	c.observe(csr, dec)
	// A denial is an Event (a Warning: something to look at). An approval
	// is not: its condition on the CSR already carries the reason and the
	// record, and an Event per machine would be one more API write for
	// every node that joins.
	if dec.Action == Deny {
		c.recorder.Event(csr, corev1.EventTypeWarning, string(dec.Reason), dec.Message)
	}
	log.Info("csr decided", "detail", dec.Message)
	return 0, nil
}

// write adds the Approved or Denied condition through the approval
// subresource. A conflict is an error: the CSR is decided again (a client
// CSR's record is then found consumed by this very CSR, and approved).
func (c *Controller) write(ctx context.Context, csr *certv1.CertificateSigningRequest, dec Decision) error {
	csr = csr.DeepCopy()
	typ := certv1.CertificateApproved
	if dec.Action == Deny {
		typ = certv1.CertificateDenied
	}
	csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
		Type: typ, Status: corev1.ConditionTrue, Reason: string(dec.Reason), Message: dec.Message,
		LastUpdateTime: metav1.NewTime(c.o.Clock()),
	})
	_, err := c.o.Client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
	return err
}

func (c *Controller) observe(csr *certv1.CertificateSigningRequest, dec Decision) {
	if c.o.Metrics == nil {
		return
	}
	c.o.Metrics.decisions.WithLabelValues(string(dec.Action), string(dec.Reason)).Inc()
	if dec.Action != Leave {
		c.o.Metrics.latency.Observe(c.o.Clock().Sub(csr.CreationTimestamp.Time).Seconds())
	}
}

// admit returns how long csr must wait for its turn in its requester's
// limit (Decider.LimitKey), 0 when it may be decided now. A CSR postponed
// is given a turn (a reservation) and keeps it, so it is looked at again
// only when its turn comes, however many others its requester queued.
func (c *Controller) admit(ctx context.Context, csr *certv1.CertificateSigningRequest) time.Duration {
	now := c.o.Clock()
	c.mu.Lock()
	if at, ok := c.turns[csr.Name]; ok {
		if now.Before(at) {
			c.mu.Unlock()
			return at.Sub(now)
		}
		delete(c.turns, csr.Name)
		c.mu.Unlock()
		return 0
	}
	c.mu.Unlock()
	key := c.o.Decider.LimitKey(ctx, csr) // outside the lock: it parses
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.limiters[key]
	if !ok {
		l = rate.NewLimiter(c.o.PerNodeRate, c.o.PerNodeBurst)
		c.limiters[key] = l
	}
	wait := l.ReserveN(now, 1).DelayFrom(now)
	if wait <= 0 {
		return 0
	}
	c.turns[csr.Name] = now.Add(wait)
	if c.o.Metrics != nil {
		c.o.Metrics.limited.Inc()
	}
	return wait
}

// record adds the certificate issued for csr to its node's lineage
// (Decider.RecordIssued), once a term.
func (c *Controller) record(ctx context.Context, csr *certv1.CertificateSigningRequest) error {
	ok, err := c.o.Decider.RecordIssued(ctx, csr)
	if err != nil {
		return fmt.Errorf("record the certificate issued for %s: %w", csr.Name, err)
	}
	c.mu.Lock()
	c.recorded[csr.Name] = string(csr.UID)
	c.mu.Unlock()
	if ok {
		if c.o.Metrics != nil {
			c.o.Metrics.recorded.Inc()
		}
		c.o.Log.Info("kubelet client certificate recorded in its node's lineage", "csr", csr.Name,
			"requester", csr.Spec.Username, "sha256", hex.EncodeToString(IssuedSHA256(csr)))
	}
	return nil
}

// catchUp records, before a CSR the node made itself is decided, the
// certificate that made it, when the CSR it was issued for is still
// cached and not yet recorded (its update may be queued behind this CSR,
// or it was issued while no approver ran).
func (c *Controller) catchUp(ctx context.Context, csr *certv1.CertificateSigningRequest) error {
	if !strings.HasPrefix(csr.Spec.Username, NodeUserPrefix) {
		return nil
	}
	sum, _ := RequesterCertificate(csr)
	if sum == nil {
		return nil
	}
	objs, err := c.indexer.ByIndex(issuedIndex, hex.EncodeToString(sum))
	if err != nil {
		return err
	}
	for _, o := range objs {
		if prev, ok := o.(*certv1.CertificateSigningRequest); ok && !c.wasRecorded(prev) {
			if err := c.record(ctx, prev); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *Controller) wasRecorded(csr *certv1.CertificateSigningRequest) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	uid, ok := c.recorded[csr.Name]
	return ok && uid == string(csr.UID)
}

// pruneLimiters drops idle (full) limiters once the table is large.
func (c *Controller) pruneLimiters() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.limiters) <= maxLimiters {
		return
	}
	now := c.o.Clock()
	for k, l := range c.limiters {
		if l.TokensAt(now) >= float64(c.o.PerNodeBurst) {
			delete(c.limiters, k)
		}
	}
}

func (c *Controller) leftChanged(name string, r attest.Reason) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.left[name] == r {
		return false
	}
	c.left[name] = r
	return true
}

func (c *Controller) forgetLeft(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.left, name)
	delete(c.turns, name)
}

// forget drops all the controller keeps about a CSR that is gone.
func (c *Controller) forget(name string) {
	c.forgetLeft(name)
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.recorded, name)
}
