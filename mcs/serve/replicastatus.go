package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/leader"
)

// ReplicaStatusConfigMap is the ConfigMap, in the store's namespace, where
// each cluster-mode replica publishes its Status (one key per replica),
// for `nodeproof status`: the policy version each judges by and a reload
// it refused, the certificate it serves. deploy/cluster ships it empty;
// the server may get and update it, by name, and nothing else.
const ReplicaStatusConfigMap = "nodeproof-server-status"

// ReplicaStatus is one replica's entry.
type ReplicaStatus struct {
	Identity  string    `json:"identity"`
	UpdatedAt time.Time `json:"updatedAt"`
	Status    Status    `json:"status"`
}

// replicaStatusEvery is how often a replica publishes; an entry not
// updated for replicaStatusForget is dropped by the next replica that
// writes (a replica gone).
const (
	replicaStatusEvery  = 30 * time.Second
	replicaStatusForget = time.Hour
)

// statusKey is identity as a ConfigMap key ([-._a-zA-Z0-9]+).
func statusKey(identity string) string { return notKeyChar.ReplaceAllString(identity, "_") }

var notKeyChar = regexp.MustCompile(`[^-._a-zA-Z0-9]`)

// publishStatus writes this replica's status into ReplicaStatusConfigMap
// at the start and every replicaStatusEvery, until ctx ends. A
// ConfigMap that is missing, or a write refused, is logged once and tried
// again later; it never stops the server.
func (c Config) publishStatus(ctx context.Context, kc kubernetes.Interface, now func() Status) {
	id, err := leader.Identity(c.Identity)
	if err != nil {
		c.Log.Warn("replica status: no identity; nodeproof status will not show this replica", "err", err.Error())
		return
	}
	ns, said := c.storeNamespace(), false
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(replicaStatusEvery)
		err := writeReplicaStatus(ctx, kc, ns, ReplicaStatus{Identity: id, UpdatedAt: c.Clock().UTC(), Status: now()})
		switch {
		case err == nil:
			said = false
		case ctx.Err() != nil:
			return
		case !said:
			said = true
			c.Log.Warn("replica status: not published; nodeproof status will not show this replica until it is", "configMap", ns+"/"+ReplicaStatusConfigMap, "err", err.Error())
		}
	}
}

// writeReplicaStatus sets r's entry in the ConfigMap and drops entries
// not updated for replicaStatusForget, in one update with the
// resourceVersion read (a conflict waits for the next round).
func writeReplicaStatus(ctx context.Context, kc kubernetes.Interface, ns string, r ReplicaStatus) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cm, err := kc.CoreV1().ConfigMaps(ns).Get(ctx, ReplicaStatusConfigMap, metav1.GetOptions{})
	if err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	for k, v := range cm.Data {
		var old ReplicaStatus
		if json.Unmarshal([]byte(v), &old) != nil || r.UpdatedAt.Sub(old.UpdatedAt) > replicaStatusForget {
			delete(cm.Data, k)
		}
	}
	cm.Data[statusKey(r.Identity)] = string(b)
	_, err = kc.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return nil // another replica wrote meanwhile: the next round
	}
	return err
}

// ReadReplicaStatus reads every replica's entry, by identity.
func ReadReplicaStatus(ctx context.Context, kc kubernetes.Interface, ns string) ([]ReplicaStatus, error) {
	cm, err := kc.CoreV1().ConfigMaps(ns).Get(ctx, ReplicaStatusConfigMap, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var out []ReplicaStatus
	for k, v := range cm.Data {
		var r ReplicaStatus
		if err := json.Unmarshal([]byte(v), &r); err != nil {
			return nil, fmt.Errorf("%s/%s key %s: %w", ns, ReplicaStatusConfigMap, k, err)
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Identity < out[j].Identity })
	return out, nil
}
