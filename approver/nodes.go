package approver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// What the node controller puts on a Node.
const (
	// ConditionAttested is the Node condition that says whether the node
	// is attested now (True), and why not (False, with the reason).
	ConditionAttested corev1.NodeConditionType = "Attested"
	// TaintUnattested is on every node nodeproof does not consider
	// attested: NoSchedule (or its pool's lifetime.taintEffect), NoExecute
	// when revoked or released.
	TaintUnattested = "nodeproof.io/unattested"
)

// BindingReader is where the node controller reads bindings and the
// names' histories: a cache kept by a watch (store/kubestore.Watched; the
// approver shares the decision cache's, kubestore.Cached).
type BindingReader interface {
	Binding(ctx context.Context, nodeName string) (*store.Binding, error)
	History(ctx context.Context, nodeName string) (*store.NameHistory, error)
	OnChange(ctx context.Context, fn func(nodeName string)) error
}

// NodeOptions configure a NodeController.
type NodeOptions struct {
	// Client reads Nodes and patches their status (the condition) and
	// spec (the taint): deploy/approver's RBAC, nothing more.
	Client kubernetes.Interface
	// EventClient posts events (default Client).
	EventClient kubernetes.Interface
	// Bindings are the store's bindings, cached (required).
	Bindings BindingReader
	// Lifetime gives a pool's freshness window and the taint effect of an
	// unattested node; nil: DefaultStaleAfter and NoSchedule.
	Lifetime func(pool string) (staleAfter time.Duration, effect corev1.TaintEffect)
	// Resync judges every node again this often (default one minute), on
	// top of the changes it watches and of each node's own staleness
	// deadline.
	Resync time.Duration
	// Clock tells the time; Log gets a line per change (both required).
	Clock func() time.Time
	Log   *slog.Logger
	// Metrics, when set, counts nodes by their judgement while this
	// controller runs (nodeproof_approver_nodes).
	Metrics *Metrics
}

// NodeController makes "this node is attested" a fact on each Node: the
// condition Attested and, while it is False, the taint
// nodeproof.io/unattested. It judges a node from its binding
// (store.Binding.Attested: not revoked, its latest attestation passed
// within its pool's window) and nothing else, so it untaints only a node
// whose identity passed, and a node whose binding it cannot read keeps
// what it has. A node whose name was ever bound stays nodeproof's: with no
// binding now and a released binding in the name's history (the store
// keeps it), it is unattested, NoExecute, whatever the Node says of itself
// — deleting or flipping its own condition changes nothing, the next
// judgement (the Node's change queues it) puts both back. A node with no
// binding and no history is not nodeproof's unless it carries the
// Attested condition (a binding deleted by hand, not released): then it is
// unattested, NoExecute, too. Run it under leader election beside the CSR
// controller.
type NodeController struct {
	o        NodeOptions
	queue    workqueue.TypedRateLimitingInterface[string]
	nodes    corelisters.NodeLister
	recorder record.EventRecorder
}

// NewNodeController checks o.
func NewNodeController(o NodeOptions) (*NodeController, error) {
	switch {
	case o.Client == nil || o.Bindings == nil:
		return nil, errors.New("approver: NodeOptions: Client and Bindings are required")
	case o.Clock == nil || o.Log == nil:
		return nil, errors.New("approver: NodeOptions: Clock and Log are required")
	}
	if o.Resync <= 0 {
		o.Resync = time.Minute
	}
	if o.EventClient == nil {
		o.EventClient = o.Client
	}
	return &NodeController{o: o}, nil
}

// Run judges nodes until ctx ends.
func (c *NodeController) Run(ctx context.Context) error {
	c.o.Metrics.resetNodes()
	defer c.o.Metrics.resetNodes()
	factory := informers.NewSharedInformerFactory(c.o.Client, c.o.Resync)
	inf := factory.Core().V1().Nodes()
	c.nodes = inf.Lister()
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodeproof-nodes"})
	defer c.queue.ShutDown()
	enqueue := func(obj any) {
		if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if n, ok := obj.(*corev1.Node); ok {
			c.queue.Add(n.Name)
		}
	}
	if _, err := inf.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) },
	}); err != nil {
		return err
	}
	if err := c.o.Bindings.OnChange(ctx, func(name string) { c.queue.Add(name) }); err != nil {
		return err
	}
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.o.EventClient.CoreV1().Events("")})
	defer b.Shutdown()
	c.recorder = kubestore.SafeRecorder(b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "nodeproof-node-controller"}))

	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return ctx.Err()
	}
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	for {
		name, quit := c.queue.Get()
		if quit {
			return nil
		}
		after, err := c.sync(ctx, name)
		switch {
		case errors.Is(err, errNodeChanged) || apierrors.IsConflict(err):
			// Another writer changed the Node between our read and our
			// write: expected, not an error. Judged again from the Node
			// as it is now.
			c.o.Log.Info("node changed meanwhile, judged again", "node", name, "err", err.Error())
			c.queue.AddRateLimited(name)
		case err != nil:
			c.o.Log.Error("node", "node", name, "err", err.Error())
			c.queue.AddRateLimited(name)
		default:
			c.queue.Forget(name)
			if after > 0 {
				c.queue.AddAfter(name, after)
			}
		}
		c.queue.Done(name)
	}
}

// judgement is what a node should carry.
type judgement struct {
	attested bool
	reason   string
	message  string
	effect   corev1.TaintEffect
}

// sync brings node name's condition and taint to what its binding says,
// and returns when to look again (its staleness deadline).
func (c *NodeController) sync(ctx context.Context, name string) (time.Duration, error) {
	node, err := c.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		c.o.Metrics.node(name, "")
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	now := c.o.Clock()
	var j judgement
	var after time.Duration
	b, err := c.o.Bindings.Binding(ctx, name)
	switch {
	case errors.Is(err, store.ErrNotFound):
		h, herr := c.o.Bindings.History(ctx, name)
		switch {
		case herr == nil && len(h.Released) > 0:
			r := h.Released[0]
			j = judgement{reason: string(attest.ReasonNotEnrolled), effect: corev1.TaintEffectNoExecute,
				message: fmt.Sprintf("no identity owns this node name since %s released it from %s at %s: the machine behind it is no longer attested",
					dashed(r.Act.By), r.Identity, r.Act.At.UTC().Format(time.RFC3339))}
		case herr != nil && !errors.Is(herr, store.ErrNotFound):
			return 0, herr // keep what the node has
		case condition(node) == nil:
			c.o.Metrics.node(name, "")
			return 0, nil // never nodeproof's
		default:
			j = judgement{reason: string(attest.ReasonNotEnrolled), effect: corev1.TaintEffectNoExecute,
				message: "no identity owns this node name any more: the machine behind it is no longer attested"}
		}
	case err != nil:
		return 0, err // keep what the node has
	default:
		stale, effect := DefaultStaleAfter, corev1.TaintEffectNoSchedule
		if c.o.Lifetime != nil {
			stale, effect = c.o.Lifetime(b.Pool)
		}
		ok, why, last := b.Attested(now, stale)
		switch {
		case ok:
			j = judgement{attested: true, reason: string(attest.ReasonNodeAttested),
				message: fmt.Sprintf("%s evidence of %s passed at %s", b.Kind, b.Identity, last.UTC().Format(time.RFC3339))}
			after = last.Add(stale).Sub(now) + time.Second
		case why == attest.ReasonRevoked:
			// The operator's reason stays with operators: the node reads
			// its own Node object.
			j = judgement{reason: string(why), effect: corev1.TaintEffectNoExecute,
				message: fmt.Sprintf("revoked by an operator at %s (nodeproof inspect %s says why)", b.Revoked.At.UTC().Format(time.RFC3339), name)}
		case why == attest.ReasonAttestationFailed && !b.Status.Rejudged.IsZero():
			// A change of the policy refused its last passing attempt's
			// claims (mcs/rejudge): the status's message says so.
			j = judgement{reason: string(why), effect: effect,
				message: fmt.Sprintf("re-judged at %s: %s %s", b.Status.Rejudged.UTC().Format(time.RFC3339), b.Status.Reason, b.Status.Message)}
		case why == attest.ReasonAttestationFailed:
			j = judgement{reason: string(why), effect: effect,
				message: fmt.Sprintf("the re-attestation at %s was refused: %s %s", last.UTC().Format(time.RFC3339), b.Status.Reason, b.Status.Message)}
		default:
			j = judgement{reason: string(why), effect: effect,
				message: fmt.Sprintf("no attestation passed since %s (window %s)", last.UTC().Format(time.RFC3339), stale)}
		}
	}
	node, err = c.setCondition(ctx, node, j, now)
	if err != nil {
		return 0, err
	}
	if err := c.setTaint(ctx, node, j, now); err != nil {
		return 0, err
	}
	c.o.Metrics.node(name, j.reason)
	return after, nil
}

func dashed(s string) string {
	if s == "" {
		return "an operator"
	}
	return s
}

func condition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == ConditionAttested {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// setCondition patches the Attested condition when its status, reason or
// message changes (a strategic merge patch of status.conditions, keyed by
// type: other conditions are the kubelet's and stay as they are). It
// returns the node as it is now.
func (c *NodeController) setCondition(ctx context.Context, node *corev1.Node, j judgement, now time.Time) (*corev1.Node, error) {
	status := corev1.ConditionFalse
	if j.attested {
		status = corev1.ConditionTrue
	}
	old := condition(node)
	if old != nil && old.Status == status && old.Reason == j.reason && old.Message == j.message {
		return node, nil
	}
	cond := corev1.NodeCondition{Type: ConditionAttested, Status: status, Reason: j.reason, Message: j.message,
		LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)}
	if old != nil && old.Status == status {
		cond.LastTransitionTime = old.LastTransitionTime
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
	if err != nil {
		return nil, err
	}
	patched, err := c.o.Client.CoreV1().Nodes().PatchStatus(ctx, node.Name, patch)
	if err != nil {
		return nil, fmt.Errorf("approver: condition of node %s: %w", node.Name, err)
	}
	if old == nil || old.Status != status {
		typ := corev1.EventTypeNormal
		if !j.attested {
			typ = corev1.EventTypeWarning
		}
		c.recorder.Event(node, typ, j.reason, "nodeproof: "+j.message)
		c.o.Log.Info("node attestation", "node", node.Name, "attested", j.attested, "reason", j.reason, "message", j.message)
	}
	return patched, nil
}

// errNodeChanged is setTaint's patch refused because the Node changed
// since it was read: the patch's test of the resourceVersion failed (the
// API server answers 422 Invalid, not 409 Conflict). The node is judged
// again; it is no error.
var errNodeChanged = errors.New("the node changed since it was read")

// setTaint adds, changes or removes the nodeproof.io/unattested taint, with
// a JSON patch that tests the resourceVersion it read (so a taint another
// writer added meanwhile is never dropped: the patch fails, errNodeChanged,
// and the node is judged again).
func (c *NodeController) setTaint(ctx context.Context, node *corev1.Node, j judgement, now time.Time) error {
	var taints []corev1.Taint
	var have *corev1.Taint
	for i, t := range node.Spec.Taints {
		if t.Key == TaintUnattested {
			have = &node.Spec.Taints[i]
			continue
		}
		taints = append(taints, t)
	}
	switch {
	case j.attested && have == nil:
		return nil
	case !j.attested && have != nil && have.Effect == j.effect:
		return nil
	case !j.attested:
		added := metav1.NewTime(now)
		taints = append(taints, corev1.Taint{Key: TaintUnattested, Value: j.reason, Effect: j.effect, TimeAdded: &added})
	}
	if taints == nil {
		taints = []corev1.Taint{}
	}
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/resourceVersion", "value": node.ResourceVersion},
		{"op": "add", "path": "/spec/taints", "value": taints},
	})
	if err != nil {
		return err
	}
	if _, err := c.o.Client.CoreV1().Nodes().Patch(ctx, node.Name, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		if apierrors.IsInvalid(err) && c.changed(ctx, node) {
			return fmt.Errorf("approver: taint of node %s: %w (resourceVersion %s tested): %w", node.Name, errNodeChanged, node.ResourceVersion, err)
		}
		return fmt.Errorf("approver: taint of node %s: %w", node.Name, err)
	}
	what := "removed"
	if !j.attested {
		what = "set, " + string(j.effect)
	}
	c.o.Log.Info("node taint "+what, "node", node.Name, "taint", TaintUnattested, "reason", j.reason)
	return nil
}

// changed reports whether the Node's resourceVersion on the API server is
// no longer node's: a 422 to setTaint's patch is then its failed test (the
// API server's answer does not say which operation failed). A Node that
// cannot be read is not known to have changed: the 422 stays an error.
func (c *NodeController) changed(ctx context.Context, node *corev1.Node) bool {
	now, err := c.o.Client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
	return err == nil && now.ResourceVersion != node.ResourceVersion
}
