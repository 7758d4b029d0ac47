package kubestore

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/nodeproof/nodeproof/safetext"
	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
)

// IdentityAnnotation, on a decision's Event, is the identity the decision
// was about (a TPM EK, a cloud instance).
const IdentityAnnotation = "nodeproof.io/identity"

// MaxEventMessage bounds an Event's message (bytes); SafeRecorder cuts
// longer ones.
const MaxEventMessage = 4 << 10

// BindingEvents writes Kubernetes Events about node names on their
// NodeBindings (`kubectl describe nodebinding NODE`, `kubectl get events`).
// It implements mcs.EnrolmentEvents, on two paths that share no budget,
// so that what anyone may send cannot bury the security record:
//
//   - Decision: the server's decisions about a name (NodeNameTaken,
//     IdentityAlreadyEnrolled, Revoked, a refusal by policy, an enrolment
//     again), as the component given. client-go's recorder aggregates
//     repeats and holds each budget to a burst of 25 Events and then one
//     every 5 minutes; here a budget is per node name, reason and
//     identity (IdentityAnnotation), so a decision of one reason cannot
//     bury another's, nor one identity's attempts another identity's.
//     What an attacker can still spend is the budget of the decisions it
//     causes itself, and each of those Events names it.
//   - Report: node failure reports (anyone may send one, unauthenticated
//     ones included), as the component with "-reports" appended, through
//     a recorder, an Event queue and an API client of its own; its budget
//     is per node name and reason, so unauthenticated reports cannot
//     spend the budget of a node's own.
//
// Every message passes through SafeRecorder. Close stops both.
//
// An Event names its NodeBinding's uid when the binding exists (UIDs):
// `kubectl describe nodebinding` lists only the Events whose
// involvedObject.uid is the object's.
type BindingEvents struct {
	ns                  string
	decisions, reports  record.EventBroadcaster
	decision, reporting record.EventRecorder
	uids                func(nodeName string) types.UID
}

// NewBindingEvents returns a BindingEvents for the NodeBindings in
// namespace, reporting as component: decisions through decisions, reports
// through reports (give it a client of its own, so that its rate limit is
// its own). Close it to stop.
func NewBindingEvents(decisions, reports kubernetes.Interface, namespace, component string) *BindingEvents {
	d := record.NewBroadcaster(record.WithCorrelatorOptions(record.CorrelatorOptions{
		KeyFunc: func(ev *corev1.Event) (string, string) {
			k, local := record.EventAggregatorByReasonFunc(ev)
			return k + "\x00" + ev.Annotations[IdentityAnnotation], local
		},
		SpamKeyFunc: func(ev *corev1.Event) string { return spamKey(ev, ev.Annotations[IdentityAnnotation]) },
	}))
	d.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: decisions.CoreV1().Events(namespace)})
	r := record.NewBroadcaster(record.WithCorrelatorOptions(record.CorrelatorOptions{
		SpamKeyFunc: func(ev *corev1.Event) string { return spamKey(ev, "") },
	}))
	r.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: reports.CoreV1().Events(namespace)})
	return &BindingEvents{ns: namespace, decisions: d, reports: r,
		decision:  SafeRecorder(d.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component})),
		reporting: SafeRecorder(r.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component + "-reports"}))}
}

// spamKey is client-go's spam key (source and object) with the Event's
// reason and identity: what one budget is kept for.
func spamKey(ev *corev1.Event, identity string) string {
	o := ev.InvolvedObject
	return strings.Join([]string{ev.Source.Component, ev.Source.Host, o.Kind, o.Namespace, o.Name, string(o.UID), o.APIVersion,
		ev.Type, ev.Reason, identity}, "\x00")
}

// UIDs has Events name the uid uid(nodeName) returns (a binding's, from a
// watch: no API call; "" when there is none, e.g. a name never enrolled).
// Call it before the first Event.
func (e *BindingEvents) UIDs(uid func(nodeName string) types.UID) { e.uids = uid }

// ref is nodeName's binding's reference, with its uid when known.
func (e *BindingEvents) ref(nodeName string) *corev1.ObjectReference {
	var uid types.UID
	if e.uids != nil {
		uid = e.uids(nodeName)
	}
	return BindingRef(e.ns, nodeName, uid)
}

// Decision implements mcs.EnrolmentEvents: a decision about nodeName
// concerning identity ("" for none); it does not block.
func (e *BindingEvents) Decision(identity, nodeName string, warning bool, reason, message string) {
	var ann map[string]string
	if identity != "" {
		ann = map[string]string{IdentityAnnotation: identity}
	}
	e.decision.AnnotatedEventf(e.ref(nodeName), ann, eventType(warning), reason, "%s", message)
}

// Report implements mcs.EnrolmentEvents: a node's failure report (a
// warning); it does not block.
func (e *BindingEvents) Report(nodeName, reason, message string) {
	e.reporting.Event(e.ref(nodeName), corev1.EventTypeWarning, reason, message)
}

// Close stops sending events.
func (e *BindingEvents) Close() {
	e.decisions.Shutdown()
	e.reports.Shutdown()
}

// SafeRecorder wraps r so that every Event's reason, message and
// annotations pass through safetext (control, format and separator
// characters replaced) and its message is cut to MaxEventMessage bytes.
// Every recorder nodeproof makes is wrapped so: Events carry text from
// outside (CSR names, node reports, refusal details).
func SafeRecorder(r record.EventRecorder) record.EventRecorder { return safeRecorder{r} }

type safeRecorder struct{ r record.EventRecorder }

func (s safeRecorder) Event(obj runtime.Object, typ, reason, message string) {
	s.r.Event(obj, typ, safetext.Clean(reason), safetext.Cut(message, MaxEventMessage))
}

func (s safeRecorder) Eventf(obj runtime.Object, typ, reason, format string, args ...any) {
	s.Event(obj, typ, reason, fmt.Sprintf(format, args...))
}

func (s safeRecorder) AnnotatedEventf(obj runtime.Object, ann map[string]string, typ, reason, format string, args ...any) {
	var clean map[string]string
	if ann != nil {
		clean = make(map[string]string, len(ann))
		for k, v := range ann {
			clean[safetext.Clean(k)] = safetext.Clean(v)
		}
	}
	s.r.AnnotatedEventf(obj, clean, typ, safetext.Clean(reason), "%s", safetext.Cut(fmt.Sprintf(format, args...), MaxEventMessage))
}

// BindingRef is the object reference of a node name's NodeBinding.
func BindingRef(namespace, nodeName string, uid types.UID) *corev1.ObjectReference {
	return &corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeBinding", Namespace: namespace, Name: nodeName, UID: uid}
}

// BindingEvent is one Event about a node name's NodeBinding.
type BindingEvent struct {
	NodeName, Reason, Message string
	Warning                   bool
	Time                      time.Time
	// UID is the binding's (store.Binding.UID); empty when it has none.
	UID types.UID
}

// WriteEvent writes ev now, waiting for the API server (for a command that
// exits next, as `nodeproof release`). Its reason and message pass through
// safetext, as SafeRecorder's do.
func WriteEvent(ctx context.Context, kc kubernetes.Interface, namespace, component string, ev BindingEvent) error {
	t := metav1.NewTime(ev.Time)
	obj := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: ev.NodeName + ".", Namespace: namespace},
		InvolvedObject: *BindingRef(namespace, ev.NodeName, ev.UID),
		Reason:         safetext.Clean(ev.Reason), Message: safetext.Cut(ev.Message, MaxEventMessage), Type: eventType(ev.Warning),
		Source:         corev1.EventSource{Component: component},
		FirstTimestamp: t, LastTimestamp: t, Count: 1,
	}
	if _, err := kc.CoreV1().Events(namespace).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kubestore: event on %s: %w", ev.NodeName, err)
	}
	return nil
}

func eventType(warning bool) string {
	if warning {
		return corev1.EventTypeWarning
	}
	return corev1.EventTypeNormal
}
