package cluster

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
)

// The bootstrap token Secret format (k8s.io/cluster-bootstrap/token/api,
// which this module does not link; the values are Kubernetes API).
const (
	BootstrapTokenNamespace = metav1.NamespaceSystem
	BootstrapTokenPrefix    = "bootstrap-token-"
	keyTokenID              = "token-id"
	keyTokenSecret          = "token-secret"
	keyExpiration           = "expiration"
	keyDescription          = "description"
	keyExtraGroups          = "auth-extra-groups"
	keyUsageAuthentication  = "usage-bootstrap-authentication"
	// BootstrapUserPrefix + token ID is the user a bootstrap token
	// authenticates as; it is always in the group system:bootstrappers.
	BootstrapUserPrefix = "system:bootstrap:"
)

// Groups every nodeproof token carries besides the implicit
// system:bootstrappers: NodeGroup for all of them (bind the CSR-creating
// role once), and NodeGroup + ":" + pool for per-pool RBAC.
const NodeGroup = "system:bootstrappers:nodeproof"

// Labels and annotations on nodeproof's token Secrets.
const (
	LabelManagedBy   = "app.kubernetes.io/managed-by"
	ManagedBy        = "nodeproof"
	AnnotationRecord = "nodeproof.io/record"
	AnnotationNode   = "nodeproof.io/node"
	AnnotationPool   = "nodeproof.io/pool"
	// LabelIdentity indexes a token by the identity it was issued to
	// (v1alpha1.LabelValue of it), so a revocation finds all of them
	// (DeleteIdentityTokens).
	LabelIdentity  = v1alpha1.IdentityLabel
	tokenIDLen     = 6
	tokenSecretLen = 16
	tokenAlphabet  = "abcdefghijklmnopqrstuvwxyz0123456789"
)

// bootstrapGroupRE is what the API server accepts in auth-extra-groups
// (cluster-bootstrap BootstrapGroupPattern); a token with any other group
// does not authenticate at all.
var bootstrapGroupRE = regexp.MustCompile(`\Asystem:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]\z`)

// PoolGroup is the group of a pool's tokens, or an error if the pool's name
// cannot be part of a bootstrap group (a MachineConfigPool name may hold
// dots, a bootstrap group may not; and it must be at most 246 characters).
func PoolGroup(pool string) (string, error) {
	g := NodeGroup + ":" + pool
	if !bootstrapGroupRE.MatchString(g) {
		return "", fmt.Errorf("cluster: pool %q cannot name a bootstrap token group (only a-z, 0-9, '-' and ':' are allowed, at most 246 characters)", pool)
	}
	return g, nil
}

// TokenOptions configure Tokens.
type TokenOptions struct {
	// Client creates, reads and deletes Secrets in kube-system.
	Client kubernetes.Interface
	// Server is the API server URL the kubeconfigs name: the MCS's
	// --apiserver-url, the internal URL nodes reach (api-int).
	Server string
	// CABundle returns the CA bundle the kubeconfigs trust for Server
	// (MCOCABundle: what the MCS uses). Called for every kubeconfig.
	CABundle func(context.Context) ([]byte, error)
	// Clock tells the time (required).
	Clock func() time.Time
	// Rand is the source of token IDs and secrets (default crypto/rand).
	Rand io.Reader
}

// Tokens issues one Kubernetes bootstrap token per attested node
// (mcs.BootstrapTokens) and builds that node's kubeconfig with it.
//
// A token is the Secret kube-system/bootstrap-token-<id>, type
// bootstrap.kubernetes.io/token, with token-id (6 of [a-z0-9]) and
// token-secret (16 of [a-z0-9]) from crypto/rand, expiration = the record's
// Expires (RFC 3339, truncated to the second), usage-bootstrap-authentication
// "true" (and no signing usage), auth-extra-groups NodeGroup and
// PoolGroup(pool), and a description naming nodeproof, the node, the pool
// and the record. The API server authenticates <id>.<secret> as
// system:bootstrap:<id> in system:bootstrappers plus those groups, until
// the expiration; it refuses it after, whether or not the Secret is gone
// (deleting expired tokens is kube-controller-manager's tokencleaner, off
// by default, or GC).
type Tokens struct {
	o TokenOptions
}

var _ mcs.BootstrapTokens = (*Tokens)(nil)

// NewTokens checks o.
func NewTokens(o TokenOptions) (*Tokens, error) {
	switch {
	case o.Client == nil, o.CABundle == nil, o.Clock == nil:
		return nil, errors.New("cluster: TokenOptions: Client, CABundle and Clock are required")
	case o.Server == "":
		return nil, errors.New("cluster: TokenOptions: Server (the API server URL nodes use) is required")
	}
	if o.Rand == nil {
		o.Rand = rand.Reader
	}
	return &Tokens{o: o}, nil
}

// Issue implements mcs.BootstrapTokens: it draws rec's token (ID and
// secret) and sets rec.BootstrapTokenID and rec.BootstrapTokenSecret; the
// token's Secret is made by Activate, at the config's first delivery.
// Refused (an error, so a 503): a record without node, pool or ID, with
// no expiry or one not after now, or for a pool whose name cannot be a
// bootstrap group (PoolGroup).
func (t *Tokens) Issue(ctx context.Context, rec *store.Record) error {
	switch {
	case rec.ID == "" || rec.NodeName == "" || rec.Pool == "":
		return errors.New("cluster: bootstrap token for a record without ID, node or pool")
	case rec.BootstrapTokenID != "":
		return errors.New("cluster: record already has a bootstrap token")
	case rec.Expires.IsZero():
		return errors.New("cluster: bootstrap token for a record that never expires")
	}
	if !rec.Expires.UTC().Truncate(time.Second).After(t.o.Clock()) {
		return errors.New("cluster: bootstrap token for a record that has expired")
	}
	if _, err := PoolGroup(rec.Pool); err != nil {
		return err
	}
	id, err := t.random(tokenIDLen)
	if err != nil {
		return err
	}
	secret, err := t.random(tokenSecretLen)
	if err != nil {
		return err
	}
	rec.BootstrapTokenID, rec.BootstrapTokenSecret = id, secret
	return nil
}

// ErrTokenIDTaken is Activate's answer when another record's token has the
// ID drawn for this one (about one in 2^31 per live token): the machine
// attests again for a new one.
var ErrTokenIDTaken = errors.New("cluster: the bootstrap token ID drawn for this record belongs to another token")

// Activate implements mcs.BootstrapTokens: it creates rec's token Secret,
// once. The Secret, named by the token ID the record holds, is the
// config's single-use marker: a second Activate for the same record is
// store.ErrUsed (the config was delivered). rec.BootstrapTokenSecret, when
// empty (a record written by an earlier answer to the same session, whose
// secret went with that answer's token), is drawn afresh: nothing used it.
//
// The marker is the credential itself, so deleting the Secret by hand
// (kubeadm token delete) while the config token is still valid
// (ConfigTokenTTL, 10 minutes by default) lets that token deliver once
// more, with the token made again: to take a node's credentials away,
// revoke the node (nodeproof revoke), which every fetch checks. The
// trade — one write per machine fewer than a marker of its own — is in
// docs/scaling.md and docs/security.md.
func (t *Tokens) Activate(ctx context.Context, rec *store.Record) error {
	if rec.BootstrapTokenID == "" {
		return errors.New("cluster: record has no bootstrap token")
	}
	exp := rec.Expires.UTC().Truncate(time.Second)
	if !exp.After(t.o.Clock()) {
		return fmt.Errorf("cluster: bootstrap token of record %s has expired", rec.ID)
	}
	group, err := PoolGroup(rec.Pool)
	if err != nil {
		return err
	}
	if rec.BootstrapTokenSecret == "" {
		if rec.BootstrapTokenSecret, err = t.random(tokenSecretLen); err != nil {
			return err
		}
	}
	id := rec.BootstrapTokenID
	labels := map[string]string{LabelManagedBy: ManagedBy}
	if rec.Identity != "" {
		labels[LabelIdentity] = v1alpha1.LabelValue(rec.Identity)
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      BootstrapTokenPrefix + id,
			Namespace: BootstrapTokenNamespace,
			Labels:    labels,
			Annotations: map[string]string{
				AnnotationRecord: rec.ID, AnnotationNode: rec.NodeName, AnnotationPool: rec.Pool,
			},
		},
		Type: corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			keyTokenID:             id,
			keyTokenSecret:         rec.BootstrapTokenSecret,
			keyExpiration:          exp.Format(time.RFC3339),
			keyUsageAuthentication: "true",
			keyExtraGroups:         NodeGroup + "," + group,
			keyDescription: fmt.Sprintf("nodeproof: bootstrap token of attested node %s (pool %s, NodeAttestation record %s)",
				rec.NodeName, rec.Pool, rec.ID),
		},
	}
	_, err = t.o.Client.CoreV1().Secrets(BootstrapTokenNamespace).Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		switch mine, gerr := t.Delivered(ctx, rec); {
		case gerr != nil:
			return gerr
		case mine:
			return fmt.Errorf("cluster: bootstrap token of record %s: %w", rec.ID, store.ErrUsed)
		default:
			return ErrTokenIDTaken
		}
	}
	if err != nil {
		return fmt.Errorf("cluster: create bootstrap token: %w", err)
	}
	return nil
}

// Delivered implements mcs.BootstrapTokens: whether rec's token Secret
// exists (Activate made it: the config was delivered).
func (t *Tokens) Delivered(ctx context.Context, rec *store.Record) (bool, error) {
	if rec.BootstrapTokenID == "" {
		return false, nil
	}
	s, err := t.o.Client.CoreV1().Secrets(BootstrapTokenNamespace).Get(ctx, BootstrapTokenPrefix+rec.BootstrapTokenID, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("cluster: read bootstrap token of record %s: %w", rec.ID, err)
	}
	return s.Annotations[AnnotationRecord] == rec.ID, nil
}

// Revoke implements mcs.BootstrapTokens: it deletes rec's token Secret
// (after a delivery that sent nothing, the config may be fetched again); a
// token already gone, or never made, is not an error.
func (t *Tokens) Revoke(ctx context.Context, rec *store.Record) error {
	if rec.BootstrapTokenID == "" {
		return nil
	}
	err := t.o.Client.CoreV1().Secrets(BootstrapTokenNamespace).Delete(ctx, BootstrapTokenPrefix+rec.BootstrapTokenID, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("cluster: delete bootstrap token: %w", err)
	}
	return nil
}

// DeleteIdentityTokens deletes every nodeproof bootstrap token Secret of
// identity — labelled with it (LabelIdentity), or, for tokens made before
// that label, made for one of records (AnnotationRecord) — and returns the
// names it deleted: what a revocation does to the node's credentials at
// once (`nodeproof revoke`), rather than when they expire. It lists
// nodeproof's token Secrets in kube-system (list and delete on secrets
// there: the operator's credentials).
func DeleteIdentityTokens(ctx context.Context, kc kubernetes.Interface, identity string, records []string) ([]string, error) {
	list, err := kc.CoreV1().Secrets(BootstrapTokenNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedBy}).String(),
		FieldSelector: "type=" + string(corev1.SecretTypeBootstrapToken),
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: list bootstrap tokens: %w", err)
	}
	mine := v1alpha1.LabelValue(identity)
	var deleted []string
	var errs []error
	for _, s := range list.Items {
		if s.Labels[LabelIdentity] != mine && !slices.Contains(records, s.Annotations[AnnotationRecord]) {
			continue
		}
		uid := s.UID
		err := kc.CoreV1().Secrets(BootstrapTokenNamespace).Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		switch {
		case err == nil:
			deleted = append(deleted, s.Name)
		case !apierrors.IsNotFound(err):
			errs = append(errs, fmt.Errorf("cluster: delete bootstrap token %s: %w", s.Name, err))
		}
	}
	return deleted, errors.Join(errs...)
}

// Kubeconfig returns the kubeconfig for rec's node: Kubeconfig(Server,
// CABundle, "<id>.<secret>") with rec's token, whose secret is
// rec.BootstrapTokenSecret: drawn by Issue, sealed in the config token
// with the record's ID, and made real by Activate before any config is
// delivered, so nothing is read back. Errors (each a 503 for the fetch,
// which Ignition retries): the record has no token, or no secret of the
// right length; the record (and so its token) has expired.
func (t *Tokens) Kubeconfig(ctx context.Context, rec *store.Record) ([]byte, error) {
	switch sec := rec.BootstrapTokenSecret; {
	case rec.BootstrapTokenID == "":
		return nil, errors.New("cluster: record has no bootstrap token")
	case len(sec) != tokenSecretLen:
		return nil, fmt.Errorf("cluster: bootstrap token of record %s: no secret of %d characters", rec.ID, tokenSecretLen)
	case !rec.Expires.After(t.o.Clock()):
		return nil, fmt.Errorf("cluster: bootstrap token of record %s has expired", rec.ID)
	}
	ca, err := t.o.CABundle(ctx)
	if err != nil {
		return nil, err
	}
	return Kubeconfig(t.o.Server, ca, rec.BootstrapTokenID+"."+rec.BootstrapTokenSecret)
}

// GC deletes nodeproof's token Secrets whose expiration has passed (the
// API server already refuses them; this only removes them, as the
// kube-controller-manager's tokencleaner would). It lists Secrets in
// kube-system by label, so it needs list on secrets there (see the package
// documentation), and returns how many it deleted.
func (t *Tokens) GC(ctx context.Context) (int, error) {
	list, err := t.o.Client.CoreV1().Secrets(BootstrapTokenNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedBy}).String(),
		FieldSelector: "type=" + string(corev1.SecretTypeBootstrapToken),
	})
	if err != nil {
		return 0, fmt.Errorf("cluster: list bootstrap tokens: %w", err)
	}
	now, n := t.o.Clock(), 0
	var errs []error
	for _, s := range list.Items {
		exp, err := time.Parse(time.RFC3339, string(s.Data[keyExpiration]))
		if err == nil && exp.After(now) {
			continue
		}
		uid := s.UID
		err = t.o.Client.CoreV1().Secrets(BootstrapTokenNamespace).Delete(ctx, s.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &uid},
		})
		switch {
		case err == nil:
			n++
		case !apierrors.IsNotFound(err) && !apierrors.IsConflict(err):
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// random returns n characters of tokenAlphabet, uniformly (rejection
// sampling: 36 does not divide 256).
func (t *Tokens) random(n int) (string, error) {
	const limit = 256 - 256%len(tokenAlphabet)
	out := make([]byte, 0, n)
	buf := make([]byte, 2*n)
	for len(out) < n {
		if _, err := io.ReadFull(t.o.Rand, buf); err != nil {
			return "", fmt.Errorf("cluster: randomness: %w", err)
		}
		for _, b := range buf {
			if int(b) < limit && len(out) < n {
				out = append(out, tokenAlphabet[int(b)%len(tokenAlphabet)])
			}
		}
	}
	return string(out), nil
}
