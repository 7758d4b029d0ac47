// Package userdata keeps the pointer configs that installer-provisioned
// machines boot with current: the Secrets openshift-machine-api/
// <role>-user-data-managed (key "userData") that MachineSets hand to new
// machines, as the Machine Config Operator does for the stock MCS.
//
// Each Secret holds an Ignition pointer config (mcs/pointer) for its pool
// with the current CA bundle of the server's certificate — nodeproof's own,
// or, when the server serves a certificate it was given (the MCS's, with
// serve --cert), the bundle that signed it (serve --ca-bundle, e.g. the
// MCO's machine-config-server-ca ConfigMap) — and, when the pool's policy
// takes the token tier, the current provisioning token. Sync rewrites a
// Secret only when what it should hold changed: after a CA rotation (the
// bundle then lists the new CA beside every still-valid old one) or a token
// rotation. Nothing a machine still being created may hold is dropped
// early: the old CA stays in the bundle until it expires (nodeproof's own
// CA is also cross-signed; the MCO keeps every valid CA in its ConfigMap),
// and the server accepts a rotated-out token for its grace period, so a
// machine that read the Secret just before the update still fetches its
// config.
//
// What the Syncer calls: get and update of each <role>-user-data-managed
// Secret, and create when one is missing. The OpenShift overlay grants get
// and update of exactly those Secrets (deploy/overlays/openshift): RBAC
// cannot narrow create to a name, and the MCO makes them.
package userdata

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/mcs/pointer"
)

// Where the Secrets live (OpenShift's machine API).
const (
	DefaultNamespace = "openshift-machine-api"
	SecretSuffix     = "-user-data-managed"
	// UserDataKey holds the pointer config; other keys of a Secret (the
	// MCO sets disableTemplating) are kept as they are.
	UserDataKey = "userData"
	// LabelManagedBy marks Secrets nodeproof created.
	LabelManagedBy = "app.kubernetes.io/managed-by"
)

// Options configure a Syncer.
type Options struct {
	Client kubernetes.Interface
	// Namespace of the Secrets (default DefaultNamespace).
	Namespace string
	// URL is the server's base URL as machines reach it, e.g.
	// https://api-int.cluster.example.com:22623 (required).
	URL string
	// Roles maps each Secret's role to its pool (e.g. worker → worker,
	// master → master); the Secret is <role>-user-data-managed.
	Roles map[string]string
	// CABundle returns the current CA bundle (PEM), read per Sync.
	CABundle func() ([]byte, error)
	// Token returns the current provisioning token for pool, or "" when the
	// pool does not take the token tier. Called per Sync.
	Token func(pool string) string
	// Version is the pointer config's spec (default pointer.DefaultVersion).
	Version string
}

// Syncer writes the user-data Secrets.
type Syncer struct{ o Options }

// New checks o.
func New(o Options) (*Syncer, error) {
	switch {
	case o.Client == nil || o.CABundle == nil || o.Token == nil:
		return nil, errors.New("userdata: Client, CABundle and Token are required")
	case o.URL == "" || len(o.Roles) == 0:
		return nil, errors.New("userdata: URL and Roles are required")
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	return &Syncer{o: o}, nil
}

// Pointer returns the pointer config a role's Secret should hold.
func (s *Syncer) Pointer(role string) ([]byte, error) {
	pool, ok := s.o.Roles[role]
	if !ok {
		return nil, fmt.Errorf("userdata: unknown role %q", role)
	}
	ca, err := s.o.CABundle()
	if err != nil {
		return nil, fmt.Errorf("userdata: CA bundle: %w", err)
	}
	return pointer.Build(pointer.Options{
		URL: strings.TrimSuffix(s.o.URL, "/") + "/config/" + pool, CABundle: ca,
		Token: s.o.Token(pool), Version: s.o.Version,
	})
}

// Sync makes every role's Secret hold its current pointer config: created
// when missing, updated when different (with the resourceVersion it read,
// so a concurrent writer is not overwritten blindly: the conflict is an
// error and the next Sync retries), left alone when equal. It returns the
// roles it wrote.
func (s *Syncer) Sync(ctx context.Context) ([]string, error) {
	var wrote []string
	var errs []error
	for _, role := range slices.Sorted(maps.Keys(s.o.Roles)) {
		changed, err := s.syncRole(ctx, role)
		if err != nil {
			errs = append(errs, fmt.Errorf("userdata: %s: %w", role, err))
		} else if changed {
			wrote = append(wrote, role)
		}
	}
	return wrote, errors.Join(errs...)
}

func (s *Syncer) syncRole(ctx context.Context, role string) (bool, error) {
	want, err := s.Pointer(role)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	secrets := s.o.Client.CoreV1().Secrets(s.o.Namespace)
	name := role + SecretSuffix
	sec, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.o.Namespace, Labels: map[string]string{LabelManagedBy: "nodeproof"}},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{UserDataKey: want},
		}, metav1.CreateOptions{})
		return err == nil, err
	}
	if err != nil {
		return false, err
	}
	if bytes.Equal(sec.Data[UserDataKey], want) {
		return false, nil
	}
	sec = sec.DeepCopy()
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	sec.Data[UserDataKey] = want
	_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
	return err == nil, err
}
