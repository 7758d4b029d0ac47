package inspect

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/mcs/render"
	"github.com/nodeproof/nodeproof/safetext"
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
		cells(tw, "", n.Name, n.Pool, n.Kind, short(n.Identity, 32),
			stamp(n.Enrolled), stamp(n.LastAttested), fmt.Sprint(n.Boots), n.State, dash(n.Reason))
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
			cells(tw, "  ", b.Identity, dash(string(b.Kind)), dash(b.NodeName), stamp(b.At), dash(b.By), dash(b.Reason))
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
			cells(tw, "  ", h.NodeName, owner, at, by, reason, fmt.Sprint(len(h.Released)), adopted)
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
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, text(v)) }
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
		writeBoot(w, s.Claims)
		c, err := cleanJSON(s.Claims)
		if err != nil {
			return fmt.Errorf("inspect: claims: %w", err)
		}
		y, err := yaml.JSONToYAML(c)
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
		cells(tw, "  ", stamp(r.CreatedAt), r.ID, string(r.Kind), consumed, dash(r.Summary))
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
		cells(tw, "  ", stamp(r.Created), r.Name, r.Requester, r.Signer, r.Decision, dash(r.Reason), dash(r.Message))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nEvents (%d):\n", len(c.Events))
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  TIME\tOBJECT\tTYPE\tREASON\tMESSAGE")
	for _, e := range c.Events {
		cells(tw, "  ", stamp(e.Time), e.Object, e.Type, e.Reason, e.Message)
	}
	return tw.Flush()
}

// write writes v as JSON or YAML, every string in it (keys, values, the
// claims' own JSON) cleaned: a consumer's `jq -r` prints what a table
// would.
func write(w io.Writer, format string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	if b, err = cleanJSON(b); err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	if format == FormatYAML {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return fmt.Errorf("inspect: %w", err)
		}
		_, err = w.Write(b)
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	out.WriteByte('\n')
	_, err = out.WriteTo(w)
	return err
}

// Every string inspect prints may have come from a machine or a client
// (a node's failure message, its evidence summary and claims, a CSR's
// name, an Event's message): each passes through safetext before it is
// printed, so that nothing a machine stored can move the terminal's
// cursor, reorder what the operator reads, or start a line of its own.

// maxText bounds one value in a table (-o json has it whole, cleaned).
const maxText = 1024

// text is s cleaned and cut for a table cell or row.
func text(s string) string { return safetext.Cut(s, maxText) }

// cells writes one tabwriter row of cleaned cells after prefix.
func cells(tw io.Writer, prefix string, vs ...string) {
	for i, v := range vs {
		vs[i] = text(v)
	}
	fmt.Fprintln(tw, prefix+strings.Join(vs, "\t"))
}

// cleanJSON is the JSON document b, compact, with every string in it
// (object keys too) passed through safetext.Clean; numbers are kept as
// written.
func cleanJSON(b []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out bytes.Buffer
	type frame struct {
		object bool
		n      int // tokens read in it: in an object, keys and values
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			if len(stack) > 0 {
				return nil, io.ErrUnexpectedEOF
			}
			break
		}
		if err != nil {
			return nil, err
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			out.WriteByte(byte(d))
			continue
		}
		if len(stack) > 0 {
			f := stack[len(stack)-1]
			switch {
			case f.object && f.n%2 == 1:
				out.WriteByte(':')
			case f.n > 0:
				out.WriteByte(',')
			}
			f.n++
		}
		switch t := tok.(type) {
		case json.Delim:
			out.WriteByte(byte(t))
			stack = append(stack, &frame{object: t == '{'})
		case string:
			e, err := json.Marshal(safetext.Clean(t))
			if err != nil {
				return nil, err
			}
			out.Write(e)
		case json.Number:
			out.WriteString(t.String())
		case bool:
			fmt.Fprint(&out, t)
		case nil:
			out.WriteString("null")
		}
	}
	return out.Bytes(), nil
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

// short cuts s, cleaned, to n runes with an ellipsis, for a table column
// (the full value is in -o json).
func short(s string, n int) string {
	s = safetext.Clean(s)
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
		cells(tw, "", e.Name, string(e.Place), e.Why)
	}
	return tw.Flush()
}

// writeBoot prints what the latest attestation's claims say of the boot:
// the EK's kind, the chain by stage, the kernel command line, the files
// GRUB read and PCRs 8 and 9 (what the whole-boot rules judge), before
// the claims in full.
func writeBoot(w io.Writer, raw []byte) {
	var c attest.Claims
	if json.Unmarshal(raw, &c) != nil || c.TPM == nil {
		return
	}
	b := c.TPM.Boot
	fmt.Fprintln(w, "\nBoot (latest attestation):")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { cells(tw, "  ", k, v) }
	if c.TPM.EKKind != "" {
		row("EK", c.TPM.EKKind)
	}
	for i, a := range b.BootApplications {
		row(b.StageOf(i), a)
	}
	for _, s := range b.UKISections {
		row("UKI "+s.Path, s.Digest)
	}
	cmdline := "not established"
	if b.KernelCmdlineKnown {
		cmdline = b.KernelCmdline
	}
	row("kernel command line", cmdline)
	for _, f := range b.GrubFiles {
		row("GRUB read", f.Digest+"  "+dash(f.Path))
	}
	if b.GrubCommandsKnown {
		row("GRUB commands", fmt.Sprintf("%d measured (claims: grubCommands)", len(b.GrubCommands)))
	}
	for _, i := range []int{8, 9} {
		if v, ok := c.TPM.PCRs[i]; ok {
			row(fmt.Sprintf("PCR %d", i), v)
		}
	}
	tw.Flush()
}
