package kubestore

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
)

// BindingEvents writes Kubernetes Events about node names on their
// NodeBindings (`kubectl describe nodebinding NODE`, `kubectl get events`):
// the enrolment decisions an operator must see. It goes through client-go's
// recorder, which aggregates repeats and rate-limits per object, so a
// machine refused over and over cannot flood the API server. It implements
// mcs.EnrolmentEvents.
type BindingEvents struct {
	ns          string
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
}

// NewBindingEvents returns a BindingEvents for the NodeBindings in
// namespace, reporting as component. Close it to stop.
func NewBindingEvents(kc kubernetes.Interface, namespace, component string) *BindingEvents {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kc.CoreV1().Events(namespace)})
	return &BindingEvents{ns: namespace, broadcaster: b,
		recorder: b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component})}
}

// Event implements mcs.EnrolmentEvents; it does not block.
func (e *BindingEvents) Event(nodeName string, warning bool, reason, message string) {
	e.recorder.Event(BindingRef(e.ns, nodeName), eventType(warning), reason, message)
}

// Close stops sending events.
func (e *BindingEvents) Close() { e.broadcaster.Shutdown() }

// BindingRef is the object reference of a node name's NodeBinding.
func BindingRef(namespace, nodeName string) *corev1.ObjectReference {
	return &corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "NodeBinding", Namespace: namespace, Name: nodeName}
}

// BindingEvent is one Event about a node name's NodeBinding.
type BindingEvent struct {
	NodeName, Reason, Message string
	Warning                   bool
	Time                      time.Time
}

// WriteEvent writes ev now, waiting for the API server (for a command that
// exits next, as `nodeproof release`).
func WriteEvent(ctx context.Context, kc kubernetes.Interface, namespace, component string, ev BindingEvent) error {
	t := metav1.NewTime(ev.Time)
	obj := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: ev.NodeName + ".", Namespace: namespace},
		InvolvedObject: *BindingRef(namespace, ev.NodeName),
		Reason:         ev.Reason, Message: ev.Message, Type: eventType(ev.Warning),
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
