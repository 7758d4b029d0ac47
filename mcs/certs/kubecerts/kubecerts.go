// Package kubecerts keeps the Machine Config Server's CA and serving
// certificate in the cluster's own objects, where the Machine Config
// Operator keeps them (OpenShift's documentation, "Machine Config Operator
// certificates", "Key material inside a cluster"), all in
// namespace openshift-machine-config-operator:
//
//	ConfigMap machine-config-server-ca   ca-bundle.crt: every still-valid CA, newest first
//	Secret    machine-config-server-ca   tls.crt, tls.key: the active CA and its signing key
//	Secret    machine-config-server-tls  tls.crt, tls.key: the serving chain and key
//
// The rotation rules are mcs/certs's (10-year CA and serving certificate,
// replaced at 80%, the new CA cross-signed by the old one, the bundle
// keeping every CA still valid); this package maps a generation's files to
// those objects and back ([certs.Next]).
//
// # Who owns them
//
// nodeproof owns the objects when the CA Secret carries the label
// app.kubernetes.io/managed-by=nodeproof, and creates them, so labelled,
// when none of the three exists. Then [Keeper.Ensure] (run by the leader
// only) rotates them. When they exist without that label they are the
// MCO's (which rotates them itself): nodeproof serves them and writes
// nothing. A cluster with a ConfigMap or serving Secret but no CA Secret is
// a cluster whose installer discarded the CA key ("Machine Config Operator certificates"): also
// served as found, never replaced.
//
// The CA Secret also keeps, under nodeproof's own keys, the whole bundle
// (ca-bundle.crt) and the cross-signed CA (ca-cross.crt): one object holds
// the CA side of a generation and is written in one update, and the
// ConfigMap is its published copy. A generation is written CA Secret first,
// then the ConfigMap, then the serving Secret: a crash between them leaves
// a serving certificate that every published bundle still verifies (the
// old one, or the new one through the cross-signed CA), and the next
// Ensure finishes the job from the CA Secret.
//
// # Checks on what is read
//
// [Keeper.Read] is what every replica serves. It refuses, naming the
// object and key: a ConfigMap without a parseable, non-empty ca-bundle.crt
// of CA certificates; a serving Secret whose tls.crt and tls.key do not
// load as a matching pair; and a bundle that does not contain the serving
// certificate's issuer (the serving chain must verify against the bundle,
// for server authentication, at the clock's time). On a refusal the caller
// keeps serving the last good snapshot. Ensure refuses a CA Secret that
// does not load (certificate, key, bundle lacking the active CA, a
// cross-signed certificate of another key) rather than replace a CA that
// pointer configs trust.
package kubecerts

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/pemcert"
)

// Names of the objects ("Machine Config Operator certificates").
const (
	DefaultNamespace = "openshift-machine-config-operator"
	// CAName names both the bundle ConfigMap and the signing key Secret.
	CAName      = "machine-config-server-ca"
	ServingName = "machine-config-server-tls"
	// BundleKey is the ConfigMap's key (and the CA Secret's copy).
	BundleKey = "ca-bundle.crt"
	// CrossKey holds the cross-signed CA in the CA Secret.
	CrossKey = "ca-cross.crt"
	// LabelManagedBy marks objects nodeproof owns.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "nodeproof"
)

// callTimeout bounds each API call.
const callTimeout = 15 * time.Second

// Options configure a Keeper.
type Options struct {
	Client kubernetes.Interface
	// Namespace of the three objects (default DefaultNamespace).
	Namespace string
	// Hosts the serving certificate is for (certs.Options.Hosts): needed
	// by Ensure and RotateServing, not by Read.
	Hosts []string
	// Clock decides validity and rotation (required).
	Clock func() time.Time
}

// Keeper reads and, when it owns them, rotates the objects.
type Keeper struct{ o Options }

// New checks o.
func New(o Options) (*Keeper, error) {
	if o.Client == nil || o.Clock == nil {
		return nil, errors.New("kubecerts: Client and Clock are required")
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	return &Keeper{o: o}, nil
}

// Snapshot is what a replica serves.
type Snapshot struct {
	// Owned: nodeproof owns the objects (the leader rotates them).
	Owned bool
	// BundlePEM is the ConfigMap's bundle: what pointer configs carry.
	BundlePEM []byte
	// ChainPEM and KeyPEM are the serving Secret's pair.
	ChainPEM, KeyPEM []byte
	// Serving is the serving certificate (ChainPEM's first).
	Serving *x509.Certificate
	// Version changes whenever any of the three objects does.
	Version string
}

// ErrAbsent is Read's answer when the objects do not exist (yet).
var ErrAbsent = errors.New("kubecerts: the MCS certificate objects do not exist")

// Where names an object's key, for errors and logs.
func (k *Keeper) where(kind, name, key string) string {
	return fmt.Sprintf("%s %s/%s key %s", kind, k.o.Namespace, name, key)
}

// objects are the three as read; nil when absent.
type objects struct {
	bundle  *corev1.ConfigMap
	ca      *corev1.Secret
	serving *corev1.Secret
}

func (k *Keeper) get(ctx context.Context) (objects, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var o objects
	cm, err := k.o.Client.CoreV1().ConfigMaps(k.o.Namespace).Get(ctx, CAName, metav1.GetOptions{})
	switch {
	case err == nil:
		o.bundle = cm
	case !apierrors.IsNotFound(err):
		return o, fmt.Errorf("kubecerts: get ConfigMap %s/%s: %w", k.o.Namespace, CAName, err)
	}
	secrets := k.o.Client.CoreV1().Secrets(k.o.Namespace)
	for _, s := range []struct {
		name string
		dst  **corev1.Secret
	}{{CAName, &o.ca}, {ServingName, &o.serving}} {
		sec, err := secrets.Get(ctx, s.name, metav1.GetOptions{})
		switch {
		case err == nil:
			*s.dst = sec
		case !apierrors.IsNotFound(err):
			return o, fmt.Errorf("kubecerts: get Secret %s/%s: %w", k.o.Namespace, s.name, err)
		}
	}
	return o, nil
}

func owned(s *corev1.Secret) bool { return s != nil && s.Labels[LabelManagedBy] == ManagedBy }

// Read reads the bundle and the serving pair and checks them (see the
// package documentation); ErrAbsent when neither exists.
func (k *Keeper) Read(ctx context.Context) (*Snapshot, error) {
	o, err := k.get(ctx)
	if err != nil {
		return nil, err
	}
	return k.snapshot(o)
}

func (k *Keeper) snapshot(o objects) (*Snapshot, error) {
	if o.bundle == nil && o.serving == nil {
		return nil, ErrAbsent
	}
	if o.bundle == nil {
		return nil, fmt.Errorf("kubecerts: ConfigMap %s/%s is missing (the serving Secret exists): no CA bundle to give machines", k.o.Namespace, CAName)
	}
	if o.serving == nil {
		return nil, fmt.Errorf("kubecerts: Secret %s/%s is missing (the bundle exists): no serving certificate", k.o.Namespace, ServingName)
	}
	bundlePEM := []byte(o.bundle.Data[BundleKey])
	bundleAt := k.where("ConfigMap", CAName, BundleKey)
	bundle, err := pemcert.Parse(bundlePEM)
	if err == nil && len(bundle) == 0 {
		err = errors.New("empty")
	}
	if err == nil {
		for _, c := range bundle {
			if !c.IsCA {
				err = fmt.Errorf("%q is not a CA", c.Subject.CommonName)
				break
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kubecerts: %s: %w", bundleAt, err)
	}
	chainPEM, keyPEM := o.serving.Data[corev1.TLSCertKey], o.serving.Data[corev1.TLSPrivateKeyKey]
	var h certs.Holder
	if err := h.Set(chainPEM, keyPEM, k.where("Secret", ServingName, corev1.TLSCertKey)+" and "+corev1.TLSPrivateKeyKey); err != nil {
		return nil, fmt.Errorf("kubecerts: %w", err)
	}
	chain, _ := pemcert.Parse(chainPEM) // loaded above
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, c := range bundle {
		roots.AddCert(c)
	}
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: k.o.Clock(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return nil, fmt.Errorf("kubecerts: %s does not contain the issuer %q of the serving certificate in %s, or it does not verify: %w",
			bundleAt, chain[0].Issuer.CommonName, k.where("Secret", ServingName, corev1.TLSCertKey), err)
	}
	return &Snapshot{
		Owned: owned(o.ca), BundlePEM: bundlePEM, ChainPEM: chainPEM, KeyPEM: keyPEM, Serving: chain[0],
		Version: o.bundle.ResourceVersion + "/" + o.serving.ResourceVersion,
	}, nil
}

// files maps owned objects to a generation's files.
func (k *Keeper) files(o objects) certs.Files {
	f := certs.Files{}
	put := func(name string, b []byte) {
		if b != nil {
			f[name] = b
		}
	}
	put(certs.CACertFileName, o.ca.Data[corev1.TLSCertKey])
	put(certs.CAKeyFileName, o.ca.Data[corev1.TLSPrivateKeyKey])
	put(certs.CABundleFileName, o.ca.Data[BundleKey])
	put(certs.CACrossFileName, o.ca.Data[CrossKey])
	if o.serving != nil {
		put(certs.ServingCertFileName, o.serving.Data[corev1.TLSCertKey])
		put(certs.ServingKeyFileName, o.serving.Data[corev1.TLSPrivateKeyKey])
	}
	return f
}

func (k *Keeper) whereFile(name string) string {
	switch name {
	case certs.CACertFileName:
		return k.where("Secret", CAName, corev1.TLSCertKey)
	case certs.CAKeyFileName:
		return k.where("Secret", CAName, corev1.TLSPrivateKeyKey)
	case certs.CABundleFileName:
		return k.where("Secret", CAName, BundleKey)
	case certs.CACrossFileName:
		return k.where("Secret", CAName, CrossKey)
	case certs.ServingCertFileName:
		return k.where("Secret", ServingName, corev1.TLSCertKey)
	case certs.ServingKeyFileName:
		return k.where("Secret", ServingName, corev1.TLSPrivateKeyKey)
	}
	return name
}

// Ensure is the leader's pass: it creates the objects when none exists,
// rotates them as mcs/certs does when nodeproof owns them (rotateCA forces
// a CA rotation), republishes the bundle ConfigMap when it differs from
// the CA Secret's, and returns what every replica then serves with one
// line per change. Objects the MCO owns are only read. Writes carry the
// resourceVersion read, so a concurrent writer makes this pass fail (the
// next one retries) instead of being overwritten.
func (k *Keeper) Ensure(ctx context.Context, rotateCA bool) (*Snapshot, []string, error) {
	return k.ensure(ctx, rotateCA, false)
}

// RotateServing is Ensure with a new serving certificate issued now, the CA
// kept (a suspected leak of the serving key, a drill).
func (k *Keeper) RotateServing(ctx context.Context) (*Snapshot, []string, error) {
	return k.ensure(ctx, false, true)
}

func (k *Keeper) ensure(ctx context.Context, rotateCA, rotateServing bool) (*Snapshot, []string, error) {
	o, err := k.get(ctx)
	if err != nil {
		return nil, nil, err
	}
	first := o.ca == nil && o.bundle == nil && o.serving == nil
	if !first && !owned(o.ca) {
		snap, err := k.snapshot(o)
		if err == nil && (rotateCA || rotateServing) {
			err = fmt.Errorf("kubecerts: %s is not nodeproof's (no %s=%s): its owner rotates it", k.where("Secret", CAName, corev1.TLSCertKey), LabelManagedBy, ManagedBy)
		}
		return snap, nil, err
	}
	var cur certs.Files
	if !first {
		cur = k.files(o)
	}
	next, st, err := certs.Next(cur, k.whereFile, "restore it, or delete the three objects to start over with a new CA (every pointer config must then be replaced)",
		certs.Options{Clock: k.o.Clock, Hosts: k.o.Hosts, RotateCA: rotateCA, RotateServing: rotateServing})
	if err != nil {
		return nil, nil, err
	}
	changes := st.Changes
	ctx, cancel := context.WithTimeout(ctx, 3*callTimeout)
	defer cancel()
	caData := map[string][]byte{
		corev1.TLSCertKey: next[certs.CACertFileName], corev1.TLSPrivateKeyKey: next[certs.CAKeyFileName],
		BundleKey: next[certs.CABundleFileName],
	}
	if b, ok := next[certs.CACrossFileName]; ok {
		caData[CrossKey] = b
	}
	if o.ca, err = k.putSecret(ctx, o.ca, CAName, caData); err != nil {
		return nil, nil, err
	}
	if o.bundle, err = k.putBundle(ctx, o.bundle, next[certs.CABundleFileName]); err != nil {
		return nil, nil, err
	}
	if o.serving, err = k.putSecret(ctx, o.serving, ServingName, map[string][]byte{
		corev1.TLSCertKey: next[certs.ServingCertFileName], corev1.TLSPrivateKeyKey: next[certs.ServingKeyFileName],
	}); err != nil {
		return nil, nil, err
	}
	snap, err := k.snapshot(o)
	return snap, changes, err
}

func (k *Keeper) meta(name, description string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: name, Namespace: k.o.Namespace,
		Labels:      map[string]string{LabelManagedBy: ManagedBy},
		Annotations: map[string]string{"openshift.io/owning-component": "nodeproof", "openshift.io/description": description},
	}
}

// putSecret creates the Secret or updates its data when it differs.
func (k *Keeper) putSecret(ctx context.Context, cur *corev1.Secret, name string, data map[string][]byte) (*corev1.Secret, error) {
	secrets := k.o.Client.CoreV1().Secrets(k.o.Namespace)
	if cur == nil {
		desc := "CA that signs the Machine Config Server's serving certificate (nodeproof)"
		if name == ServingName {
			desc = "the Machine Config Server's serving certificate (nodeproof)"
		}
		s, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: k.meta(name, desc), Type: corev1.SecretTypeTLS, Data: data}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("kubecerts: create Secret %s/%s: %w", k.o.Namespace, name, err)
		}
		return s, nil
	}
	if maps.EqualFunc(cur.Data, data, bytes.Equal) {
		return cur, nil
	}
	s := cur.DeepCopy()
	s.Data = data
	s, err := secrets.Update(ctx, s, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubecerts: update Secret %s/%s: %w", k.o.Namespace, name, err)
	}
	return s, nil
}

// putBundle creates the ConfigMap or updates its bundle when it differs
// (other keys are kept).
func (k *Keeper) putBundle(ctx context.Context, cur *corev1.ConfigMap, bundle []byte) (*corev1.ConfigMap, error) {
	cms := k.o.Client.CoreV1().ConfigMaps(k.o.Namespace)
	if cur == nil {
		cm, err := cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: k.meta(CAName, "CA bundle that stores all valid CAs for the Machine Config Server's TLS certificate (nodeproof)"),
			Data:       map[string]string{BundleKey: string(bundle)},
		}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("kubecerts: create ConfigMap %s/%s: %w", k.o.Namespace, CAName, err)
		}
		return cm, nil
	}
	if cur.Data[BundleKey] == string(bundle) {
		return cur, nil
	}
	cm := cur.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[BundleKey] = string(bundle)
	cm, err := cms.Update(ctx, cm, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubecerts: update ConfigMap %s/%s: %w", k.o.Namespace, CAName, err)
	}
	return cm, nil
}

// Names lists the objects, for logs.
func (k *Keeper) Names() []string {
	return []string{"ConfigMap " + k.o.Namespace + "/" + CAName, "Secret " + k.o.Namespace + "/" + CAName, "Secret " + k.o.Namespace + "/" + ServingName}
}
