package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/mcs/pointer"
	"github.com/nodeproof/nodeproof/mcs/tokens"
)

// Where the provisioning token lives (the OpenShift enhancement "mco-auth-token",
// "Support a provisioning token for the Machine Config Server"):
//
//	oc -n openshift-config create secret generic machineconfig-auth --from-file=token
const (
	TokenSecretNamespace = "openshift-config"
	TokenSecretName      = "machineconfig-auth"
	// TokenKey holds the current token (the seed's key). Surrounding
	// white space is ignored: `base64 > token` ends it with a newline.
	TokenKey = "token"
	// TokenHistoryKey is nodeproof's own: the tokens still in their grace
	// period, with when each was made and retired (the token file's
	// format). The current token is always TokenKey's.
	TokenHistoryKey = "tokens.json"
)

// TokenSecret keeps the provisioning tokens in the Secret
// openshift-config/machineconfig-auth: a tokens.Store. An operator may
// create or replace the Secret by hand with only the "token" key, as the
// seed does; that token is then the current one (made when the Secret was
// last written), and the
// tokens of the history are retired at that moment, valid for their grace
// period. Save writes both keys, with the resourceVersion read, so a
// concurrent writer makes it fail instead of being overwritten.
type TokenSecret struct {
	Client    kubernetes.Interface
	Namespace string // default TokenSecretNamespace
	Name      string // default TokenSecretName

	mu   sync.Mutex
	last *corev1.Secret // as last read or written
}

var _ tokens.Store = (*TokenSecret)(nil)

func (t *TokenSecret) ns() string   { return cmp.Or(t.Namespace, TokenSecretNamespace) }
func (t *TokenSecret) name() string { return cmp.Or(t.Name, TokenSecretName) }

// Created is when the Secret was made (zero before it was read): when
// the tokens moved to the cluster.
func (t *TokenSecret) Created() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil {
		return time.Time{}
	}
	return t.last.CreationTimestamp.Time
}

// String names the Secret.
func (t *TokenSecret) String() string { return "Secret " + t.ns() + "/" + t.name() }

// Load reads the Secret; an error wrapping fs.ErrNotExist when it is
// missing. A Secret without a usable "token" key, or with a history that
// does not parse, is refused with the key named.
func (t *TokenSecret) Load(ctx context.Context) ([]tokens.Token, error) {
	sec, err := t.Client.CoreV1().Secrets(t.ns()).Get(ctx, t.name(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%s: %w", t, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", t, err)
	}
	list, err := t.parse(sec)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	t.last = sec
	t.mu.Unlock()
	return list, nil
}

func (t *TokenSecret) parse(sec *corev1.Secret) ([]tokens.Token, error) {
	raw, ok := sec.Data[TokenKey]
	if !ok {
		return nil, fmt.Errorf("%s has no key %q (it has: %s): the provisioning token goes under %q (oc -n %s create secret generic %s --from-file=token)",
			t, TokenKey, strings.Join(slices.Sorted(maps.Keys(sec.Data)), ", "), TokenKey, t.ns(), t.name())
	}
	cur := strings.TrimSpace(string(raw))
	if err := pointer.CheckToken(cur); err != nil {
		return nil, fmt.Errorf("%s key %q: %w", t, TokenKey, err)
	}
	var hist []tokens.Token
	if b, ok := sec.Data[TokenHistoryKey]; ok {
		if err := json.Unmarshal(b, &hist); err != nil {
			return nil, fmt.Errorf("%s key %q does not parse: %w", t, TokenHistoryKey, err)
		}
		for i, h := range hist {
			if err := pointer.CheckToken(h.Value); err != nil {
				return nil, fmt.Errorf("%s key %q entry %d: %w", t, TokenHistoryKey, i, err)
			}
		}
	}
	if len(hist) > 0 && hist[0].Value == cur && hist[0].Retired == nil {
		return hist, nil
	}
	// Set by hand: the token is current since the Secret was last
	// written (its newest managed-fields time; else its creation), so
	// every replica reads the same list; the history is retired then.
	made := sec.CreationTimestamp.Time
	for _, mf := range sec.ManagedFields {
		if mf.Time != nil && mf.Time.After(made) {
			made = mf.Time.Time
		}
	}
	out := []tokens.Token{{Value: cur, Created: made}}
	for _, h := range hist {
		if h.Value == cur {
			continue
		}
		if h.Retired == nil {
			h.Retired = &made
		}
		out = append(out, h)
	}
	return out, nil
}

// Save writes the list: the current token under "token", the list under
// "tokens.json"; other keys are kept. It creates the Secret when Load found
// none.
func (t *TokenSecret) Save(ctx context.Context, list []tokens.Token) error {
	if len(list) == 0 {
		return fmt.Errorf("save %s: no token", t)
	}
	hist, err := json.Marshal(list)
	if err != nil {
		return err
	}
	secrets := t.Client.CoreV1().Secrets(t.ns())
	t.mu.Lock()
	defer t.mu.Unlock()
	var sec *corev1.Secret
	if t.last == nil {
		sec, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: t.name(), Namespace: t.ns(), Labels: map[string]string{LabelManagedBy: ManagedBy}},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{TokenKey: []byte(list[0].Value), TokenHistoryKey: hist},
		}, metav1.CreateOptions{})
	} else {
		sec = t.last.DeepCopy()
		if sec.Data == nil {
			sec.Data = map[string][]byte{}
		}
		sec.Data[TokenKey], sec.Data[TokenHistoryKey] = []byte(list[0].Value), hist
		sec, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("save %s: %w", t, err)
	}
	t.last = sec
	return nil
}
