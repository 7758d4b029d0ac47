package attest

import (
	"bytes"
	"crypto/rand"
	"errors"
	"testing"
	"testing/iotest"
	"time"
)

// TestSession: NewSession refuses a kubelet key hash of the wrong size
// and a failing random source, and opens a session CheckSession accepts
// until it expires; CheckSession refuses another kind's session, a nil
// one, a nonce or key hash of the wrong size, and an expired one, each
// with its reason.
func TestSession(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	key := bytes.Repeat([]byte{7}, 32)
	if _, err := NewSession(KindGCP, "worker", key[:31], rand.Reader, now, time.Minute); reasonOf(err) != ReasonMalformed {
		t.Errorf("31-byte key hash: %v, want %s", err, ReasonMalformed)
	}
	if _, err := NewSession(KindGCP, "worker", key, iotest.ErrReader(errors.New("no entropy")), now, time.Minute); err == nil {
		t.Error("a session without a nonce")
	}
	sess, err := NewSession(KindGCP, "worker", key, rand.Reader, now, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(sess.Nonce) != NonceSize || sess.Pool != "worker" || !sess.Expires.Equal(now.Add(time.Minute)) {
		t.Fatalf("session %+v", sess)
	}
	key[0] = 8 // the session holds its own copy
	if sess.KubeletKeySHA256[0] != 7 {
		t.Error("the session shares the caller's key hash")
	}
	with := func(edit func(*Session)) *Session { s := *sess; edit(&s); return &s }
	cases := []struct {
		name string
		s    *Session
		kind Kind
		at   time.Time
		want Reason // "": accepted
	}{
		{"fresh", sess, KindGCP, now, ""},
		{"a second before it expires", sess, KindGCP, now.Add(time.Minute - time.Second), ""},
		{"expired", sess, KindGCP, now.Add(time.Minute), ReasonSessionExpired},
		{"another kind's", sess, KindAWS, now, ReasonSessionInvalid},
		{"nil", nil, KindGCP, now, ReasonSessionInvalid},
		{"short nonce", with(func(s *Session) { s.Nonce = s.Nonce[:16] }), KindGCP, now, ReasonSessionInvalid},
		{"no key hash", with(func(s *Session) { s.KubeletKeySHA256 = nil }), KindGCP, now, ReasonSessionInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckSession(tc.s, tc.kind, tc.at)
			if got := reasonOf(err); got != tc.want {
				t.Errorf("reason %q (%v), want %q", got, err, tc.want)
			}
		})
	}
}

func reasonOf(err error) Reason {
	r, _ := ReasonOf(err)
	return r
}

// TestSessions: NewSessions requires a clock, refuses a negative TTL and
// defaults the TTL to DefaultSessionTTL; Open opens a session of its kind
// at the clock's now that Check accepts until the TTL has passed, and Check
// refuses another kind's session.
func TestSessions(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		ttl     time.Duration
		clock   bool
		wantErr string
		wantTTL time.Duration
	}{
		{name: "no clock", ttl: time.Minute, wantErr: "x: Options.Clock is required"},
		{name: "negative TTL", ttl: -time.Second, clock: true, wantErr: "x: Options.SessionTTL -1s is negative"},
		{name: "zero TTL is the default", clock: true, wantTTL: DefaultSessionTTL},
		{name: "a TTL of its own", ttl: time.Minute, clock: true, wantTTL: time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := t0
			var clock func() time.Time
			if tc.clock {
				clock = func() time.Time { return now }
			}
			s, err := NewSessions(KindGCP, "x", tc.ttl, clock, nil)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			sess, err := s.Open("worker", make([]byte, 32))
			if err != nil {
				t.Fatal(err)
			}
			if sess.Kind != KindGCP || sess.Pool != "worker" || !sess.IssuedAt.Equal(t0) || !sess.Expires.Equal(t0.Add(tc.wantTTL)) || len(sess.Nonce) != NonceSize {
				t.Fatalf("session %+v: want gcp, worker, issued %s, expiring after %s, a %d-byte nonce", sess, t0, tc.wantTTL, NonceSize)
			}
			now = t0.Add(tc.wantTTL - time.Second)
			if got, err := s.Check(sess); err != nil || !got.Equal(now) {
				t.Fatalf("Check before expiry: %v, %s", err, got)
			}
			now = t0.Add(tc.wantTTL)
			if _, err := s.Check(sess); !isReason(err, ReasonSessionExpired) {
				t.Fatalf("Check at expiry: %v, want SessionExpired", err)
			}
			other, err := NewSessions(KindAWS, "y", 0, clock, nil)
			if err != nil {
				t.Fatal(err)
			}
			now = t0
			if _, err := other.Check(sess); !isReason(err, ReasonSessionInvalid) {
				t.Fatalf("another kind's Check: %v, want SessionInvalid", err)
			}
		})
	}
}
