package inspect

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/nodeproof/nodeproof/mcs/render"
)

// Formats of Write.
const (
	FormatTable = "table"
	FormatJSON  = "json"
	FormatYAML  = "yaml"
)

// CheckFormat refuses a format Write does not know.
func CheckFormat(f string) error {
	switch f {
	case FormatTable, FormatJSON, FormatYAML:
		return nil
	}
	return fmt.Errorf("inspect: output %q: want table, json or yaml", f)
}

// WriteList writes nodes in format.
func WriteList(w io.Writer, format string, nodes []Node) error {
	if format != FormatTable {
		return write(w, format, map[string]any{"nodes": nodes})
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tPOOL\tKIND\tIDENTITY\tENROLLED\tLAST ATTESTED\tBOOTS\tSTATE\tREASON")
	for _, n := range nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", n.Name, n.Pool, n.Kind, short(n.Identity, 32),
			stamp(n.Enrolled), stamp(n.LastAttested), n.Boots, n.State, dash(n.Reason))
	}
	return tw.Flush()
}

// WriteOverview writes o in format: the nodes (as WriteList), then the
// banned identities and the released names.
func WriteOverview(w io.Writer, format string, o *Overview) error {
	if format != FormatTable {
		return write(w, format, o)
	}
	if err := WriteList(w, format, o.Nodes); err != nil {
		return err
	}
	if len(o.Bans) > 0 {
		fmt.Fprintf(w, "\nBanned identities (%d; nodeproof unban lifts a ban):\n", len(o.Bans))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  IDENTITY\tKIND\tNODE WHEN BANNED\tBANNED\tBY\tREASON")
		for _, b := range o.Bans {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", b.Identity, dash(string(b.Kind)), dash(b.NodeName), stamp(b.At), dash(b.By), dash(b.Reason))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(o.Released) > 0 {
		fmt.Fprintf(w, "\nReleased names no machine holds now (%d; their Nodes stay tainted):\n", len(o.Released))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  NODE\tLAST OWNER\tRELEASED\tBY\tREASON\tRELEASES\tADOPTED")
		for _, h := range o.Released {
			owner, at, by, reason := "-", "-", "-", "-"
			if len(h.Released) > 0 {
				r := h.Released[0]
				owner, at, by, reason = r.Identity, stamp(r.Act.At), dash(r.Act.By), dash(r.Act.Reason)
				if r.Revoked {
					owner += " (revoked)"
				}
			}
			adopted := "-"
			if h.Adopted != nil {
				adopted = stamp(h.Adopted.At) + " by " + dash(h.Adopted.By)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%d\t%s\n", h.NodeName, owner, at, by, reason, len(h.Released), adopted)
		}
		return tw.Flush()
	}
	return nil
}

// WriteStory writes a node's story in format.
func WriteStory(w io.Writer, format string, s *Story) error {
	if format != FormatTable {
		return write(w, format, s)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("Node", s.Name)
	row("Pool", s.Pool)
	row("Identity", fmt.Sprintf("%s (%s evidence)", s.Identity, s.Kind))
	state := s.State
	if s.Reason != "" {
		state += " (" + s.Reason + ")"
	}
	row("State", state)
	if s.Message != "" {
		row("Why", s.Message)
	}
	if b := s.Binding; b != nil {
		row("Enrolled", fmt.Sprintf("%s; last enrolment %s, record %s", stamp(b.CreatedAt), stamp(b.EnrolledAt), b.RecordID))
		row("Last attested", stamp(s.LastAttested))
		if !b.Status.LastAttempt.IsZero() {
			res := "passed"
			if !b.Status.Passed {
				res = "failed: " + b.Status.Reason
			}
			row("Last attempt", fmt.Sprintf("%s, %s", stamp(b.Status.LastAttempt), res))
			if b.Status.Passed && b.Status.Audit != "" {
				row("Audit", "admitted; rules in audit mode would have refused it: "+strings.ReplaceAll(b.Status.Audit, "\n", "; "))
			}
		}
		row("Boots", fmt.Sprintf("%d since enrolment (TPM reset count %d, restart count %d)", b.Status.Boots, b.Status.ResetCount, b.Status.RestartCount))
		if b.Revoked != nil {
			row("Revoked", fmt.Sprintf("%s by %s: %s", stamp(b.Revoked.At), dash(b.Revoked.By), dash(b.Revoked.Reason)))
		}
	}
	for _, ban := range s.Bans {
		row("Banned", fmt.Sprintf("%s (%s evidence) at %s by %s: %s; held %s", ban.Identity, dash(string(ban.Kind)), stamp(ban.At), dash(ban.By), dash(ban.Reason), dash(ban.NodeName)))
	}
	if h := s.History; h != nil {
		for _, r := range h.Released {
			revoked := ""
			if r.Revoked {
				revoked = ", revoked"
			}
			row("Released", fmt.Sprintf("%s by %s from %s (%s evidence, pool %s, enrolled %s%s): %s", stamp(r.Act.At), dash(r.Act.By), r.Identity, r.Kind, r.Pool, stamp(r.CreatedAt), revoked, dash(r.Act.Reason)))
		}
		if a := h.Adopted; a != nil {
			row("Adopted", fmt.Sprintf("%s by %s: %s", stamp(a.At), dash(a.By), dash(a.Reason)))
		}
	}
	if s.Evidence != "" {
		row("Evidence", s.Evidence)
	}
	if c := s.Cluster; c != nil {
		node := "not registered"
		if c.Registered {
			node = "registered"
			if cond := c.Condition; cond != nil {
				node += fmt.Sprintf("; condition Attested=%s (%s: %s)", cond.Status, cond.Reason, cond.Message)
			}
			for _, t := range c.Taints {
				node += fmt.Sprintf("; taint %s:%s", t.Key, t.Effect)
			}
		}
		row("Node object", node)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(s.Claims) > 0 {
		y, err := yaml.JSONToYAML(s.Claims)
		if err != nil {
			return fmt.Errorf("inspect: claims: %w", err)
		}
		fmt.Fprintf(w, "\nClaims (latest attestation):\n%s", indent(string(y)))
	}
	fmt.Fprintf(w, "\nRecords (%d, newest first):\n", len(s.Records))
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  CREATED\tID\tKIND\tCONSUMED\tEVIDENCE")
	for _, r := range s.Records {
		consumed := "-"
		if r.ConsumedAt != nil {
			consumed = stamp(*r.ConsumedAt) + " by " + r.ConsumedBy
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", stamp(r.CreatedAt), r.ID, r.Kind, consumed, dash(r.Summary))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	c := s.Cluster
	if c == nil {
		fmt.Fprintln(w, "\n(CSRs and Events: the embedded store has no cluster; run with --store kubernetes)")
		return nil
	}
	fmt.Fprintf(w, "\nCSRs (%d):\n", len(c.CSRs))
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  CREATED\tNAME\tREQUESTER\tSIGNER\tDECISION\tREASON\tMESSAGE")
	for _, r := range c.CSRs {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", stamp(r.Created), r.Name, r.Requester, r.Signer, r.Decision, dash(r.Reason), dash(r.Message))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nEvents (%d):\n", len(c.Events))
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  TIME\tOBJECT\tTYPE\tREASON\tMESSAGE")
	for _, e := range c.Events {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", stamp(e.Time), e.Object, e.Type, e.Reason, e.Message)
	}
	return tw.Flush()
}

func write(w io.Writer, format string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	if format == FormatYAML {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return fmt.Errorf("inspect: %w", err)
		}
	} else {
		b = append(b, '\n')
	}
	_, err = w.Write(b)
	return err
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// short cuts s to n runes with an ellipsis, for a table column (the full
// value is in -o json).
func short(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func indent(s string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = "  " + l
		}
	}
	return strings.Join(lines, "")
}

// WritePool writes where each MachineConfig of pool goes (render.PoolTiers).
func WritePool(w io.Writer, format, pool string, es []render.TierEntry) error {
	if format != FormatTable {
		return write(w, format, map[string]any{"pool": pool, "machineConfigs": es})
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MACHINECONFIG\tTIER\tWHY")
	for _, e := range es {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", e.Name, e.Place, e.Why)
	}
	return tw.Flush()
}
