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
// # The installer's <role>-user-data Secrets
//
// Machines made before the MCO managed user data boot from
// openshift-machine-api/<role>-user-data, written by the installer. As the
// MCO's certificate controller does (OpenShift's documentation, "Machine Config Operator
// certificates"), Sync keeps the CA bundle in
// each such Secret that exists current, and, when its pointer config
// carries a provisioning token (an Authorization header or ?token=) and the
// pool takes the token tier, the token too. Everything else in it stays as
// the installer wrote it; the result must parse as an Ignition 3 config, or
// the Secret is left alone and the error reported. Sync never creates one.
//
// What the Syncer calls: get and update of each <role>-user-data-managed
// and <role>-user-data Secret, and create when a managed one is missing. The OpenShift overlay grants get
// and update of exactly those Secrets (deploy/overlays/openshift): RBAC
// cannot narrow create to a name, and the MCO makes them.
package userdata

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	ignconfig "github.com/coreos/ignition/v2/config"
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
	// InstallerSuffix names the installer's Secrets (<role>-user-data).
	InstallerSuffix = "-user-data"
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

// Sync makes every role's managed Secret hold its current pointer config:
// created when missing, updated when different (with the resourceVersion it read,
// so a concurrent writer is not overwritten blindly: the conflict is an
// error and the next Sync retries), left alone when equal; and it brings
// the installer's Secret of each role, where one exists, up to date (see
// the package documentation). It returns the Secrets it wrote.
func (s *Syncer) Sync(ctx context.Context) ([]string, error) {
	var wrote []string
	var errs []error
	for _, role := range slices.Sorted(maps.Keys(s.o.Roles)) {
		changed, err := s.syncRole(ctx, role)
		if err != nil {
			errs = append(errs, fmt.Errorf("userdata: %s: %w", role+SecretSuffix, err))
		} else if changed {
			wrote = append(wrote, role+SecretSuffix)
		}
		changed, err = s.syncInstaller(ctx, role)
		if err != nil {
			errs = append(errs, fmt.Errorf("userdata: %s: %w", role+InstallerSuffix, err))
		} else if changed {
			wrote = append(wrote, role+InstallerSuffix)
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

// syncInstaller updates <role>-user-data's CA bundle (and token) in place.
func (s *Syncer) syncInstaller(ctx context.Context, role string) (bool, error) {
	ca, err := s.o.CABundle()
	if err != nil {
		return false, fmt.Errorf("CA bundle: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	secrets := s.o.Client.CoreV1().Secrets(s.o.Namespace)
	sec, err := secrets.Get(ctx, role+InstallerSuffix, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	old, ok := sec.Data[UserDataKey]
	if !ok {
		return false, fmt.Errorf("no key %q", UserDataKey)
	}
	want, changed, err := Patch(old, ca, s.o.Token(s.o.Roles[role]))
	if err != nil || !changed {
		return false, err
	}
	sec = sec.DeepCopy()
	sec.Data[UserDataKey] = want
	_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
	return err == nil, err
}

// Patch sets the CA bundle a pointer config (Ignition 3) trusts to ca and,
// when token is not empty and the config already carries a provisioning
// token in a merge or replace source (an "Authorization: Bearer" header,
// or ?token= in the URL), that token to token. The rest of the config is
// kept. It reports whether anything changed; the result must parse with
// Ignition's own parser. A token that is not printable ASCII is refused.
func Patch(raw, ca []byte, token string) ([]byte, bool, error) {
	if token != "" {
		if err := pointer.CheckToken(token); err != nil {
			return nil, false, err
		}
	}
	if _, rpt, err := ignconfig.Parse(raw); err != nil {
		return nil, false, fmt.Errorf("the pointer config does not parse as Ignition 3: %w: %s", err, rpt.String())
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, false, err
	}
	before, err := json.Marshal(cfg)
	if err != nil {
		return nil, false, err
	}
	ign := child(cfg, "ignition")
	tls := child(child(ign, "security"), "tls")
	tls["certificateAuthorities"] = []any{map[string]any{"source": "data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString(ca)}}
	if token != "" {
		conf, _ := ign["config"].(map[string]any)
		var sources []any
		if m, ok := conf["merge"].([]any); ok {
			sources = append(sources, m...)
		}
		if r, ok := conf["replace"].(map[string]any); ok {
			sources = append(sources, r)
		}
		for _, src := range sources {
			setToken(src, token)
		}
	}
	after, err := json.Marshal(cfg)
	if err != nil {
		return nil, false, err
	}
	if bytes.Equal(before, after) {
		return raw, false, nil
	}
	if _, rpt, err := ignconfig.Parse(after); err != nil {
		return nil, false, fmt.Errorf("the updated pointer config does not parse: %w: %s", err, rpt.String())
	}
	return after, true, nil
}

// child returns m[key] as an object, making it when absent.
func child(m map[string]any, key string) map[string]any {
	if c, ok := m[key].(map[string]any); ok {
		return c
	}
	c := map[string]any{}
	m[key] = c
	return c
}

// setToken replaces the token a config source carries, if it carries one.
func setToken(src any, token string) {
	m, ok := src.(map[string]any)
	if !ok {
		return
	}
	if hs, ok := m["httpHeaders"].([]any); ok {
		for _, h := range hs {
			if hm, ok := h.(map[string]any); ok && strings.EqualFold(fmt.Sprint(hm["name"]), "Authorization") {
				if v, ok := hm["value"].(string); ok && strings.HasPrefix(v, "Bearer ") {
					hm["value"] = "Bearer " + token
				}
			}
		}
	}
	if s, ok := m["source"].(string); ok {
		if u, err := url.Parse(s); err == nil && u.Query().Has("token") {
			q := u.Query()
			q.Set("token", token)
			u.RawQuery = q.Encode()
			m["source"] = u.String()
		}
	}
}
