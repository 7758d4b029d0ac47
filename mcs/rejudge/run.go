package rejudge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/store"
)

// Store is what Run uses: one list of the bindings (with their recorded
// claims: the store itself, not a cache that drops them), and a
// read-modify-write of each changed node's status.
type Store interface {
	Bindings(ctx context.Context) ([]*store.Binding, error)
	UpdateStatus(ctx context.Context, nodeName, identity string, fn func(*store.Binding) error) (*store.Binding, error)
}

// Events publishes a decision about a node (mcs.EnrolmentEvents'
// Decision): nil, none.
type Events interface {
	Decision(identity, nodeName string, warning bool, reason, message string)
}

// Options say what Run judges by and where it writes.
type Options struct {
	Store  Store
	Policy *policy.Policy
	// Version names the policy in messages and the log ("" for none).
	Version string
	// Clock is the pass's clock (the time judged at, and written).
	Clock func() time.Time
	// Events, when set, has an Event per node written.
	Events Events
	// Log, when set, has the pass's summary line (and each failed write).
	Log *slog.Logger
	// Workers bounds the writes in flight (0: 4).
	Workers int
	// Seen, when set, is shown the pass's list of bindings (read only)
	// before the judging: what else is counted of the whole fleet in the
	// same list (the Secure Boot CA standings' gauge).
	Seen func([]*store.Binding)
}

// Counts are what a pass did.
type Counts struct {
	// Nodes is how many bindings the list held.
	Nodes int `json:"nodes"`
	// Judged are the nodes the pass judged (pass or fail) whose state is
	// the re-judge's: neither revoked nor failed by their last attempt.
	Judged int `json:"judged"`
	// NotJudged are those whose recorded claims cannot decide it
	// (Verdict.Why): their state stays.
	NotJudged int `json:"notJudged"`
	// Skipped are the revoked, those whose last attempt failed and those
	// never re-attested since their enrolment.
	Skipped int `json:"skipped"`
	// Failed (newly failing), Refailed (failing by another rule now),
	// Cleared (failed by a re-judge, passing again) and Audited (the
	// audits changed) are the writes made.
	Failed   int `json:"failed"`
	Refailed int `json:"refailed"`
	Cleared  int `json:"cleared"`
	Audited  int `json:"audited"`
	// Raced are the nodes whose status changed between the list and the
	// write (a re-attestation): judged again on the fresh read, which
	// decided.
	Raced int `json:"raced"`
	// Errors are writes that failed (the log says why); the next pass
	// judges those nodes again.
	Errors int `json:"errors"`
	// Took is how long the pass took.
	Took time.Duration `json:"took"`
}

// Writes is how many statuses the pass wrote.
func (c Counts) Writes() int { return c.Failed + c.Refailed + c.Cleared + c.Audited }

// errKeep ends a status update that has nothing to write.
var errKeep = errors.New("nothing to write")

// Run is one re-judge of the fleet: every binding listed once, judged in
// memory (Decide), and only the nodes whose state changes written — each
// in a store.UpdateStatus whose function judges the status it reads again,
// so a re-attestation between the list and the write is never lost (the
// fresh read is judged; a node whose fresh state is unchanged is not
// written). Each write has an Event (PolicyRejudged, or PolicyAuditRefusal
// when only the audits changed); the log has one summary line. A node
// Failed reads as one whose re-attestation was refused: the approver's
// node controller sets its Attested condition False and taints it by its
// pool's lifetime.
func Run(ctx context.Context, o Options) (Counts, error) {
	start := o.Clock()
	now := start
	var c Counts
	bs, err := o.Store.Bindings(ctx)
	if err != nil {
		return c, fmt.Errorf("rejudge: list bindings: %w", err)
	}
	c.Nodes = len(bs)
	if o.Seen != nil {
		o.Seen(bs)
	}
	var todo []*store.Binding
	for _, b := range bs {
		d := Decide(o.Policy, b, now)
		switch {
		case d.Skipped != "":
			c.Skipped++
			continue
		case d.Verdict.Outcome == NotJudged:
			c.NotJudged++
			continue
		}
		c.Judged++
		if d.Change != Keep {
			todo = append(todo, b)
		}
	}
	workers := o.Workers
	if workers <= 0 {
		workers = 4
	}
	var mu sync.Mutex
	jobs := make(chan *store.Binding)
	var wg sync.WaitGroup
	for range min(workers, max(len(todo), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range jobs {
				ch, raced, err := o.write(ctx, b, now)
				mu.Lock()
				switch ch {
				case Failed:
					c.Failed++
				case Refailed:
					c.Refailed++
				case Cleared:
					c.Cleared++
				case Audited:
					c.Audited++
				}
				if raced {
					c.Raced++
				}
				if err != nil {
					c.Errors++
				}
				mu.Unlock()
				if err != nil && o.Log != nil {
					o.Log.Error("policy re-judge: a node's status was not written; the next pass judges it again", "node", b.NodeName, "err", err.Error())
				}
			}
		}()
	}
feed:
	for _, b := range todo {
		select {
		case jobs <- b:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	c.Took = o.Clock().Sub(start)
	if o.Log != nil {
		o.Log.Info("policy re-judged the fleet", "version", o.Version, "nodes", c.Nodes, "judged", c.Judged,
			"failed", c.Failed, "refailed", c.Refailed, "cleared", c.Cleared, "audited", c.Audited,
			"notJudged", c.NotJudged, "skipped", c.Skipped, "raced", c.Raced, "errors", c.Errors, "took", c.Took.String())
	}
	return c, ctx.Err()
}

// write judges b's node again on a fresh read and writes the change, if
// any; raced says the fresh status was not the listed one. A node gone,
// or bound to another identity since the list, is not written.
func (o Options) write(ctx context.Context, listed *store.Binding, now time.Time) (Change, bool, error) {
	var d Decision
	raced := false
	b, err := o.Store.UpdateStatus(ctx, listed.NodeName, listed.Identity, func(b *store.Binding) error {
		raced = !sameStatus(&b.Status, &listed.Status) || (b.Revoked == nil) != (listed.Revoked == nil)
		d = Decide(o.Policy, b, now)
		if d.Skipped != "" || d.Change == Keep {
			return errKeep
		}
		d.apply(b, o.Version, now)
		return nil
	})
	switch {
	case errors.Is(err, errKeep):
		return Keep, raced, nil
	case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrNameTaken):
		return Keep, true, nil // released (and enrolled again) since the list
	case err != nil:
		return Keep, raced, err
	}
	o.event(b, d)
	return d.Change, raced, nil
}

// sameStatus: the status read is the one listed (its last attempt and
// its outcome).
func sameStatus(a, b *store.AttestationStatus) bool {
	return a.LastAttempt.Equal(b.LastAttempt) && a.Passed == b.Passed && a.Reason == b.Reason && a.Rejudged.Equal(b.Rejudged)
}

// event publishes the change written to b.
func (o Options) event(b *store.Binding, d Decision) {
	if o.Events == nil {
		return
	}
	v := ""
	if o.Version != "" {
		v = " (version " + o.Version + ")"
	}
	switch d.Change {
	case Failed, Refailed:
		o.Events.Decision(b.Identity, b.NodeName, true, string(attest.ReasonPolicyRejudged),
			fmt.Sprintf("node %s fails the policy in force: %s %s", b.NodeName, b.Status.Reason, b.Status.Message))
	case Cleared:
		o.Events.Decision(b.Identity, b.NodeName, false, string(attest.ReasonPolicyRejudged),
			fmt.Sprintf("node %s passes the policy in force%s again: the claims of its last passing attestation (%s) are no longer refused",
				b.NodeName, v, b.Status.LastAttempt.UTC().Format(time.RFC3339)))
	case Audited:
		o.Events.Decision(b.Identity, b.NodeName, true, string(attest.ReasonPolicyAudit),
			fmt.Sprintf("node %s passes the policy in force%s, whose rules in audit mode would refuse the claims of its last passing attestation:\n%s",
				b.NodeName, v, policy.FormatAudits(d.Verdict.Audits, 1024)))
	}
}
