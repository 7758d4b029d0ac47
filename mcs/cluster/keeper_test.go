package cluster

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
)

// TestStartKeeperRefusesIncompleteOptions: a keeper without a client, an
// identity in the Lease, a reload interval, a clock, a log or anything to
// keep refuses to start (rather than campaign or spin).
func TestStartKeeperRefusesIncompleteOptions(t *testing.T) {
	full := KeeperOptions{Client: fake.NewClientset(), Tokens: true, Identity: "a", Reload: time.Second,
		Clock: time.Now, Log: slog.New(slog.DiscardHandler), LeaseNamespace: "nodeproof"}
	for _, tc := range []struct {
		name string
		edit func(*KeeperOptions)
	}{
		{"no client", func(o *KeeperOptions) { o.Client = nil }},
		{"no identity", func(o *KeeperOptions) { o.Identity = "" }},
		{"no reload", func(o *KeeperOptions) { o.Reload = 0 }},
		{"no clock", func(o *KeeperOptions) { o.Clock = nil }},
		{"no log", func(o *KeeperOptions) { o.Log = nil }},
		{"nothing to keep", func(o *KeeperOptions) { o.Tokens = false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := full
			tc.edit(&o)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if k, err := StartKeeper(ctx, o); err == nil || k != nil {
				t.Fatalf("StartKeeper = %v, %v; want a refusal", k, err)
			}
		})
	}
}
