package operate_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
	"github.com/nodeproof/nodeproof/store/operate"
	"github.com/nodeproof/nodeproof/store/storetest"
)

// tpmIdentity is a well-formed TPM identity for n.
func tpmIdentity(n int) string {
	d := sha256.Sum256([]byte{byte(n)})
	return "tpm-ek:" + hex.EncodeToString(d[:])
}

// enrolled is a store with worker-1 enrolled by tpmIdentity(1) (two
// records of it, one of another machine's that held the name before).
func enrolled(t *testing.T) (*boltstore.Store, time.Time) {
	t.Helper()
	now := time.Date(2026, 11, 29, 5, 0, 0, 0, time.UTC)
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"), time.Second, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := storetest.Record(storetest.ID(1), "worker-1", now)
	r.Identity = tpmIdentity(1)
	if err := st.Enrol(context.Background(), r, store.EnrolOptions{}); err != nil {
		t.Fatal(err)
	}
	return st, now
}

// TestRevoke: each refusal before any write, and what a ban names.
func TestRevoke(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		r           operate.Revocation
		wantErr     string
		wantBanned  string // identity banned afterwards
		wantRecords int
		wantEvent   bool
	}{
		{name: "neither node nor identity", wantErr: "one of a node and an identity"},
		{name: "both", r: operate.Revocation{Node: "worker-1", Identity: tpmIdentity(1)}, wantErr: "one of a node and an identity"},
		{name: "not enrolled without identity", r: operate.Revocation{Node: "worker-1", NotEnrolled: true}, wantErr: "goes with an identity"},
		{name: "misspelt identity", r: operate.Revocation{Identity: strings.ToUpper(tpmIdentity(1))}, wantErr: "canonical form"},
		{name: "unseen identity", r: operate.Revocation{Identity: tpmIdentity(2)}, wantErr: "never seen it"},
		{name: "unbound node", r: operate.Revocation{Node: "worker-9"}, wantErr: "not bound to any machine"},
		{name: "by node", r: operate.Revocation{Node: "worker-1", Act: store.Act{By: "alice"}}, wantBanned: tpmIdentity(1), wantRecords: 1, wantEvent: true},
		{name: "by identity", r: operate.Revocation{Identity: tpmIdentity(1)}, wantBanned: tpmIdentity(1), wantRecords: 1, wantEvent: true},
		{name: "unseen identity, not enrolled", r: operate.Revocation{Identity: tpmIdentity(2), NotEnrolled: true}, wantBanned: tpmIdentity(2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := enrolled(t)
			o, err := operate.Revoke(ctx, st, tc.r)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Revoke = %v, want an error with %q", err, tc.wantErr)
				}
				if bans, _ := st.Bans(ctx); len(bans) != 0 {
					t.Fatalf("a refused revoke banned %v", bans)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.BanOf(ctx, tc.wantBanned); err != nil {
				t.Fatalf("%s not banned: %v", tc.wantBanned, err)
			}
			if !o.Revoked || o.Identity != tc.wantBanned || len(o.TokenRecords) != tc.wantRecords || (o.Event != nil) != tc.wantEvent {
				t.Fatalf("outcome %+v", o)
			}
			if o.Event != nil && (o.Event.Reason != "Revoked" || !o.Event.Warning || o.Event.NodeName != "worker-1") {
				t.Fatalf("event %+v", o.Event)
			}
		})
	}
}

// recording are Effects that record what they were asked.
type recording struct {
	deleted []string
	events  []operate.Event
	fail    error
}

func (r *recording) DeleteIdentityTokens(_ context.Context, identity string, records []string) ([]string, error) {
	r.deleted = append(r.deleted, identity)
	return records, r.fail
}

func (r *recording) WriteEvent(_ context.Context, ev operate.Event) error {
	r.events = append(r.events, ev)
	return nil
}

// TestApply: a revoke deletes the identity's tokens even when it held no
// name, and a failed deletion is reported with the ban standing; other
// workflows only write their Event; nil Effects do nothing.
func TestApply(t *testing.T) {
	ctx := context.Background()
	st, _ := enrolled(t)
	o, err := operate.Revoke(ctx, st, operate.Revocation{Identity: tpmIdentity(3), NotEnrolled: true})
	if err != nil {
		t.Fatal(err)
	}
	eff := &recording{fail: errors.New("forbidden")}
	if _, err := o.Apply(ctx, eff); err == nil || !strings.Contains(err.Error(), "the ban stands") {
		t.Fatalf("Apply with a failing deletion = %v", err)
	}
	if len(eff.deleted) != 1 || eff.deleted[0] != tpmIdentity(3) || len(eff.events) != 0 {
		t.Fatalf("effects of a nameless revoke: %+v", eff)
	}
	if _, err := o.Apply(ctx, nil); err != nil {
		t.Fatal(err)
	}
	rel, err := operate.Release(ctx, st, operate.Naming{Node: "worker-1", Act: store.Act{By: "bob"}})
	if err != nil {
		t.Fatal(err)
	}
	eff = &recording{}
	if _, err := rel.Apply(ctx, eff); err != nil || len(eff.deleted) != 0 || len(eff.events) != 1 || eff.events[0].Reason != "Released" {
		t.Fatalf("release effects %+v, %v", eff, err)
	}
}

// TestUnbanReleaseAdopt: the other workflows, refusals and outcomes.
func TestUnbanReleaseAdopt(t *testing.T) {
	ctx := context.Background()
	st, _ := enrolled(t)
	if _, err := operate.Unban(ctx, st, operate.Lift{Node: "worker-1"}); err == nil || !strings.Contains(err.Error(), "is not banned") {
		t.Fatalf("unban of an unbanned node: %v", err)
	}
	if _, err := operate.Release(ctx, st, operate.Naming{Node: "worker-9"}); err == nil || !strings.Contains(err.Error(), "not bound") {
		t.Fatalf("release of an unbound name: %v", err)
	}
	if _, err := operate.Revoke(ctx, st, operate.Revocation{Node: "worker-1"}); err != nil {
		t.Fatal(err)
	}
	rel, err := operate.Release(ctx, st, operate.Naming{Node: "worker-1", Act: store.Act{By: "bob", Reason: "RMA"}})
	if err != nil || !strings.Contains(rel.Message, "stays revoked") || !strings.Contains(rel.Message, "reason: RMA") {
		t.Fatalf("release of a revoked machine's name: %+v, %v", rel, err)
	}
	// The name is free, the ban is found by the name it held.
	un, err := operate.Unban(ctx, st, operate.Lift{Node: "worker-1", Act: store.Act{By: "carol"}})
	if err != nil || un.Identity != tpmIdentity(1) || un.Event == nil || un.Event.Reason != "Unbanned" {
		t.Fatalf("unban by the name held: %+v, %v", un, err)
	}
	ad, err := operate.Adopt(ctx, st, operate.Naming{Node: "legacy-1", Act: store.Act{By: "dave"}})
	if err != nil || !strings.Contains(ad.Message, "adopted by dave") || ad.Event.Reason != "Adopted" {
		t.Fatalf("adopt: %+v, %v", ad, err)
	}
	if _, err := operate.ClearMarker(ctx, st, ""); err == nil {
		t.Fatal("ClearMarker of no key: no error")
	}
}

// TestClaimsOf: a node's recorded claims, none, and ones that do not
// decode.
func TestClaimsOf(t *testing.T) {
	ctx := context.Background()
	st, now := enrolled(t)
	if _, err := operate.ClaimsOf(ctx, st, "worker-1"); !errors.Is(err, operate.ErrNoClaims) {
		t.Fatalf("ClaimsOf before a re-attestation: %v, want ErrNoClaims", err)
	}
	if _, err := operate.ClaimsOf(ctx, st, "worker-9"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("ClaimsOf an unbound name: %v, want ErrNotFound", err)
	}
	raw, _ := json.Marshal(attest.Claims{Kind: attest.KindTPM, Identity: tpmIdentity(1), TPM: &attest.TPMClaims{PCRBank: "sha256"}})
	for _, tc := range []struct {
		name    string
		claims  []byte
		wantErr bool
	}{
		{name: "recorded", claims: raw},
		{name: "not JSON", claims: []byte("{"), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := st.UpdateStatus(ctx, "worker-1", tpmIdentity(1), func(b *store.Binding) error {
				b.Status = store.AttestationStatus{LastAttempt: now, Passed: true, Claims: tc.claims}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			nc, err := operate.ClaimsOf(ctx, st, "worker-1")
			if tc.wantErr != (err != nil) {
				t.Fatalf("ClaimsOf = %v, want error %v", err, tc.wantErr)
			}
			if err == nil && (nc.Claims.TPM == nil || nc.Claims.TPM.PCRBank != "sha256" || nc.Binding.NodeName != "worker-1") {
				t.Fatalf("claims %+v", nc)
			}
		})
	}
}
