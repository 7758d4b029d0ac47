package store

import (
	"fmt"
	"slices"
	"time"
)

// Conflict says why Enrol refused an enrolment.
type Conflict string

// Conflicts Enrol reports (EnrolConflict.Reason), each with the sentinel
// error it unwraps to.
const (
	// ConflictBanned: the identity is banned (ErrRevoked).
	ConflictBanned Conflict = "Banned"
	// ConflictRevoked: the binding enrolled again under is revoked
	// (ErrRevoked); Binding is it.
	ConflictRevoked Conflict = "Revoked"
	// ConflictNameBound: the node name is bound to another identity
	// (ErrNameTaken); Binding is that identity's, when the store saw it.
	ConflictNameBound Conflict = "NameBound"
	// ConflictIdentityBound: the identity is already enrolled — under
	// another name, or without Again, or with another kubelet key
	// (ErrIdentityEnrolled); Binding is the identity's, nil when it holds
	// none any more (released, or an enrolment still completing).
	ConflictIdentityBound Conflict = "IdentityBound"
	// ConflictPoolFixed: enrolling again named another pool than the
	// binding's (ErrPoolFixed); Binding is it.
	ConflictPoolFixed Conflict = "PoolFixed"
	// ConflictRecordExists: a record with the enrolment's ID exists
	// (ErrExists).
	ConflictRecordExists Conflict = "RecordExists"
	// ConflictMarkerSpent: a single-use marker of the enrolment was set
	// (ErrUsed).
	ConflictMarkerSpent Conflict = "MarkerSpent"
	// ConflictLiveCap: enrolling again, the identity already holds
	// EnrolOptions.MaxLive unexpired records for the name
	// (ErrEnrolmentCap); Live lists their expiries, Binding is the
	// name's.
	ConflictLiveCap Conflict = "LiveCap"
)

// EnrolConflict is Enrol's refusal: what conflicts, as the store saw it in
// the write that refused (so the caller decides without reading again).
// It unwraps to the sentinel of its Reason (errors.Is(err, ErrNameTaken)
// and so on keep working).
type EnrolConflict struct {
	Reason Conflict
	// Binding is the binding that conflicts (see each Conflict), or nil.
	Binding *Binding
	// Record is the record stored under the enrolment's record ID, when
	// there is one: an earlier answer to the same session wrote it.
	Record *Record
	// Live, of ConflictLiveCap, are the expiries of the identity's
	// unexpired records for the name, soonest first.
	Live []time.Time
	// Delivered, when EnrolOptions.Delivered named a marker, reports
	// whether it is set (of ConflictRecordExists, ConflictMarkerSpent and
	// ConflictIdentityBound: the refusals an earlier answer to the same
	// session may explain).
	Delivered bool
	// Detail says more, for the message (e.g. which name, which identity).
	Detail string
}

// Answerable reports whether c is a refusal an earlier answer to the same
// session may explain: the record exists, a marker is set, or the
// identity is enrolled (under that record, before it enrolled again).
func (c *EnrolConflict) Answerable() bool {
	return c.Reason == ConflictRecordExists || c.Reason == ConflictMarkerSpent || c.Reason == ConflictIdentityBound
}

// LiveOf returns the expiries of r.Identity's records in recs (a node
// name's) that are unexpired when r is created, soonest first: what
// EnrolOptions.MaxLive caps.
func LiveOf(recs []*Record, r *Record) []time.Time {
	var live []time.Time
	for _, x := range recs {
		if x.Identity == r.Identity && x.Expires.After(r.CreatedAt) {
			live = append(live, x.Expires)
		}
	}
	slices.SortFunc(live, func(a, b time.Time) int { return a.Compare(b) })
	return live
}

// NewConflict returns the conflict reason with its binding and the record
// stored under the enrolment's ID (either may be nil) and a detail for the
// message.
func NewConflict(reason Conflict, b *Binding, rec *Record, detail string, args ...any) *EnrolConflict {
	if len(args) > 0 {
		detail = fmt.Sprintf(detail, args...)
	}
	return &EnrolConflict{Reason: reason, Binding: b, Record: rec, Detail: detail}
}

// Error is the detail and the sentinel's message.
func (c *EnrolConflict) Error() string {
	if c.Detail == "" {
		return c.Unwrap().Error()
	}
	return c.Detail + ": " + c.Unwrap().Error()
}

// Unwrap is the sentinel of c.Reason.
func (c *EnrolConflict) Unwrap() error {
	switch c.Reason {
	case ConflictBanned, ConflictRevoked:
		return ErrRevoked
	case ConflictNameBound:
		return ErrNameTaken
	case ConflictIdentityBound:
		return ErrIdentityEnrolled
	case ConflictPoolFixed:
		return ErrPoolFixed
	case ConflictRecordExists:
		return ErrExists
	case ConflictMarkerSpent:
		return ErrUsed
	case ConflictLiveCap:
		return ErrEnrolmentCap
	}
	return fmt.Errorf("enrol conflict %q", string(c.Reason))
}
