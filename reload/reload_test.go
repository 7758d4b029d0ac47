package reload

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestRefusals(t *testing.T) {
	a, b := errors.New("a"), errors.New("b")
	type step struct {
		err            error
		forget         bool
		say, recovered bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a first refusal is said", []step{{err: a, say: true}}},
		{"the same refusal again is not", []step{{err: a, say: true}, {err: a}}},
		{"a different refusal is", []step{{err: a, say: true}, {err: b, say: true}, {err: a, say: true}}},
		{"a success after a refusal is the recovery", []step{{err: a, say: true}, {recovered: true}, {}}},
		{"a success with nothing refused is no recovery", []step{{}, {}}},
		{"after a success the same refusal is said again", []step{{err: a, say: true}, {recovered: true}, {err: a, say: true}}},
		{"after Forget the same refusal is said again", []step{{err: a, say: true}, {forget: true}, {err: a, say: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Refusals
			for i, s := range tc.steps {
				if s.forget {
					r.Forget()
					continue
				}
				say, recovered := r.Note(s.err)
				if say != s.say || recovered != s.recovered {
					t.Fatalf("step %d (%v): say %v recovered %v, want %v %v", i, s.err, say, recovered, s.say, s.recovered)
				}
			}
		})
	}
}

func TestEveryAndNow(t *testing.T) {
	for _, tc := range []struct {
		name      string
		run       func(context.Context, time.Duration, func(context.Context))
		d         time.Duration
		wantFirst bool // a pass before the first interval has passed
	}{
		{"Every waits an interval before its first pass", Every, time.Hour, false},
		{"Now passes at once", Now, time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			passes := make(chan struct{}, 10)
			done := make(chan struct{})
			go func() {
				tc.run(ctx, tc.d, func(context.Context) { passes <- struct{}{} })
				close(done)
			}()
			select {
			case <-passes:
				if !tc.wantFirst {
					t.Fatal("a pass before the first interval")
				}
			case <-time.After(100 * time.Millisecond):
				if tc.wantFirst {
					t.Fatal("no pass at once")
				}
			}
			cancel()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("did not return after ctx ended")
			}
		})
	}
	t.Run("Every passes every interval until ctx ends", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		n := 0
		Every(ctx, time.Millisecond, func(context.Context) {
			if n++; n == 3 {
				cancel()
			}
		})
		if n != 3 {
			t.Fatalf("%d passes, want 3 (none after ctx ended)", n)
		}
	})
}
