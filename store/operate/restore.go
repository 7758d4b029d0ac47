package operate

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/store/boltstore"
)

// Restoring asks to replace the embedded store at Path with the backup
// at From (the server stopped).
type Restoring struct {
	Path, From string
	// Force restores even when the store being replaced cannot be read:
	// every ban, release and spent single-use marker made after the
	// backup is then undone (and said so).
	Force bool
	// Lock is how long to wait for the store's lock; Now decides which
	// single-use markers are still set.
	Lock time.Duration
	Now  time.Time
}

// Restored is a restore's outcome: one line per thing done, kept or
// undone, in the order an operator acts on them.
type Restored struct {
	Lines []string
}

// Restore replaces the store with a backup (boltstore.Restore: the
// backup passes every check, the server must be stopped, the replaced
// file is kept) and says what it carried over from the store it replaced
// (bans, releases, adoptions, consumed records and spent markers made
// after the backup), which bans it put back, and which machines must
// enrol again. Over a store it cannot read it refuses without Force.
func Restore(r Restoring) (*Restored, error) {
	res, err := boltstore.Restore(r.Path, r.From, boltstore.RestoreOptions{Lock: r.Lock, Now: r.Now, Force: r.Force})
	switch {
	case errors.Is(err, boltstore.ErrCannotCarry):
		return nil, fmt.Errorf("%w\nnothing was restored; --force restores anyway, and every ban, release and spent single-use marker since the backup is then undone", err)
	case err != nil:
		return nil, fmt.Errorf("stop the server first: %w", err)
	}
	out := &Restored{Lines: []string{fmt.Sprintf("restored %s from %s: %s", r.Path, r.From, Describe(res.Backup))}}
	if res.Replaced != "" {
		out.Lines = append(out.Lines, "the file it replaced is kept as "+res.Replaced)
	}
	out.Lines = append(out.Lines, carried(res)...)
	return out, nil
}

// Describe says what a store check found, in one line.
func Describe(rep boltstore.Report) string {
	var buckets []string
	for name, n := range rep.Buckets {
		buckets = append(buckets, fmt.Sprintf("%s=%d", name, n))
	}
	sort.Strings(buckets)
	s := fmt.Sprintf("%d bytes, last commit transaction %d", rep.Size, rep.Txid)
	if rep.Marker > 0 {
		s += fmt.Sprintf(" (commit marker %d)", rep.Marker)
	}
	return s + "; " + strings.Join(buckets, " ")
}

// carried says what a restore kept from the store it replaced, what it
// undid and who enrols again.
func carried(res boltstore.Restored) []string {
	var out []string
	add := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	if res.NotCarried != nil {
		add("WARNING: the replaced store could not be read (%v): every ban, release and spent single-use marker made after the backup is undone; revoke, release and rotate the provisioning token again", res.NotCarried)
	}
	c := res.Carried
	for _, b := range c.Bans {
		add("kept: ban of %s (%s%s), made after the backup", b.Identity, orNone(b.NodeName), reasonOf(b.Reason))
	}
	for _, r := range c.Releases {
		how := "its history kept"
		if r.Unbound {
			how = "the backup's binding to it released again"
		}
		add("kept: release of %s from %s at %s (%s)", r.NodeName, r.Released.Identity, r.Released.Act.At.UTC().Format(time.RFC3339), how)
	}
	for _, n := range c.Adoptions {
		add("kept: adoption of %s", n)
	}
	if len(c.Consumed) > 0 {
		add("kept: %d record(s) whose CSR was approved after the backup stay consumed", len(c.Consumed))
	}
	if c.Markers > 0 {
		add("kept: %d single-use marker(s) set after the backup (config tokens spent) stay set", c.Markers)
	}
	for _, b := range c.Rebanned {
		add("banned again: %s (%s%s): unbanned after the backup; a restore lifts no ban, so `nodeproof unban --identity %s` again if meant", b.Identity, orNone(b.NodeName), reasonOf(b.Reason), b.Identity)
	}
	if len(c.Lost) > 0 {
		add("enrol again: %s (enrolled after the backup; their bindings are not in it)", strings.Join(c.Lost, ", "))
	}
	if res.NotCarried == nil && c.Empty() {
		add("nothing was done after the backup that the restore undoes")
	}
	return out
}

func orNone(name string) string {
	if name == "" {
		return "no name"
	}
	return name
}

func reasonOf(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}
