package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
)

// cmdPolicy is `nodeproof policy check FILE [--against-records]`.
func cmdPolicy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "check" {
		return errors.New("policy: usage: nodeproof policy check FILE [--against-records] [store flags]")
	}
	fs := newFlagSet("policy check", stderr)
	var c ServeConfig
	storeFlags(fs, &c)
	against := fs.Bool("against-records", false, "judge every enrolled node's last recorded claims by this policy: which would fail, and why")
	file, err := parseOneNode(fs, args[1:])
	if err != nil {
		return errors.New("policy check: one policy FILE is required")
	}
	pol, err := loadPolicy(file)
	if err != nil {
		return err // names the pool and the field
	}
	fmt.Fprintf(stdout, "%s: valid (%d pools)\n", file, len(pol.Pools))
	if !*against {
		return nil
	}
	c.Clock = time.Now
	st, err := c.openStoreTimeout(false, time.Second)
	if err != nil {
		return fmt.Errorf("policy check: open the store (with the embedded store, stop the server first): %w", err)
	}
	defer st.Close()
	bs, err := st.Bindings(ctx)
	if err != nil {
		return fmt.Errorf("policy check: %w", err)
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].NodeName < bs[j].NodeName })
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tPOOL\tKIND\tUNDER THIS POLICY\tWHY")
	failing := 0
	for _, b := range bs {
		verdict, why := "unknown", "no claims recorded yet (enrolled, not re-attested since)"
		if len(b.Status.Claims) > 0 {
			var cl attest.Claims
			if err := json.Unmarshal(b.Status.Claims, &cl); err != nil {
				verdict, why = "unknown", "recorded claims do not decode"
			} else if err := pol.EvaluateReattestation(b.Pool, &cl); err != nil {
				r, _ := attest.ReasonOf(err)
				verdict, why = "FAIL "+string(r), err.Error()
				if r == attest.ReasonPolicyDBX && withoutDBXContents(pol, b.Pool).EvaluateReattestation(b.Pool, &cl) == nil {
					// Only minimumDBX.contains failed: a status records the
					// dbx's entry count, not its entries.
					verdict, why = "unknown", "the dbx's entries are not recorded (only their count): "+err.Error()
				} else {
					failing++
				}
			} else {
				verdict, why = "pass", "last claims from "+b.Status.LastAttempt.UTC().Format(time.RFC3339)
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", b.NodeName, b.Pool, b.Kind, verdict, why)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d of %d nodes would fail at their next re-attestation\n", failing, len(bs))
	return nil
}

// withoutDBXContents is pol with pool's minimumDBX.contains dropped.
func withoutDBXContents(pol *policy.Policy, pool string) *policy.Policy {
	cp := *pol
	cp.Pools = maps.Clone(pol.Pools)
	pp := cp.Pools[pool]
	if m := pp.TPM.MinimumDBX; m != nil {
		mm := *m
		mm.Contains = nil
		pp.TPM.MinimumDBX = &mm
	}
	cp.Pools[pool] = pp
	return &cp
}
