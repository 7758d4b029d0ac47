package tokens

import (
	"context"
	"fmt"
	"io/fs"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/internal/attacktable"
)

// memStore is a Store in memory (the Secret's behaviour is tested on a
// real API server in mcs/cluster).
type memStore struct{ list []Token }

func (m *memStore) Load(context.Context) ([]Token, error) {
	if m.list == nil {
		return nil, fmt.Errorf("mem: %w", fs.ErrNotExist)
	}
	return append([]Token(nil), m.list...), nil
}
func (m *memStore) Save(_ context.Context, l []Token) error {
	m.list = append([]Token(nil), l...)
	return nil
}
func (m *memStore) String() string { return "memory" }

// TestAttacksOnRotation: what a provisioning token taken from one
// machine's user data is worth once the token rotates on a schedule.
func TestAttacksOnRotation(t *testing.T) {
	const grace = 24 * time.Hour
	verdict := func(ok bool) string {
		if ok {
			return "accepted"
		}
		return "refused"
	}
	for _, tc := range []struct {
		attack string
		steps  func(p *Provisioning, advance func(time.Duration))
		want   string
	}{
		{"a stolen token, after one rotation, within the grace period", func(p *Provisioning, adv func(time.Duration)) {
			adv(time.Hour)
			p.Rotate()
			adv(grace - time.Minute)
		}, "accepted"},
		{"a stolen token, after one rotation and the grace period", func(p *Provisioning, adv func(time.Duration)) {
			adv(time.Hour)
			p.Rotate()
			adv(grace)
		}, "refused"},
		{"a stolen token, after two rotations in quick succession, past the first's grace", func(p *Provisioning, adv func(time.Duration)) {
			p.Rotate()
			adv(time.Minute)
			p.Rotate()
			adv(grace)
		}, "refused"},
		{"a stolen token presented again and again through the grace period keeps nothing alive", func(p *Provisioning, adv func(time.Duration)) {
			stolen := p.Current()
			p.Rotate()
			for range 24 {
				adv(time.Hour)
				p.Check(stolen)
			}
		}, "refused"},
	} {
		t.Run(tc.attack, func(t *testing.T) {
			now := t0
			p, err := Open(context.Background(), &memStore{}, grace, func() time.Time { return now }, true)
			if err != nil {
				t.Fatal(err)
			}
			stolen := p.Current()
			tc.steps(p, func(d time.Duration) { now = now.Add(d) })
			attacktable.Check(t, "provisioning token", tc.attack, tc.want, verdict(p.Check(stolen)))
		})
	}
}
