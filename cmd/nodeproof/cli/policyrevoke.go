package cli

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/attest/uefivar"
	"github.com/nodeproof/nodeproof/fsutil"
	"github.com/nodeproof/nodeproof/safetext"
)

// cmdPolicyRevoke is `nodeproof policy revoke --pool NAME [--dbx-update
// FILE]... [--sbat-level FILE] [--require-dbx] POLICY`: revocations as
// published, read (attest/uefivar, tpm.ParseSBATLevel) and turned into
// the pool's rules (policy.AddRevocations), the policy written to -o or
// standard output; what each file held, and what changed, said on
// standard error.
func cmdPolicyRevoke(_ context.Context, in *invocation) error {
	fs := in.flags()
	pool := fs.String("pool", "", "the pool whose rules the revocations join (required)")
	var dbx efiFlag
	fs.Var(&dbx, "dbx-update", "a UEFI dbx update as published (an authenticated variable, EFI_VARIABLE_AUTHENTICATION_2 then EFI_SIGNATURE_LISTs: DBXUpdate.bin), or bare signature lists: its image hashes into tpm.deniedDigests, its certificates into tpm.deniedSigners; repeat for each")
	sbat := fs.String("sbat-level", "", "shim's SbatLevel text (sbat,1,DATE then COMPONENT,GENERATION lines: a payload of shim's SbatLevel_Variable.txt, or a copy of the SbatLevelRT variable): tpm.minimumSBAT raised to it")
	requireDBX := fs.Bool("require-dbx", false, "with --dbx-update: also require the nodes' own dbx (their PCR 7 measurements) to hold the updates' image hashes (tpm.minimumDBX.contains): a node whose firmware lacks the update is refused DBXOutdated")
	out := fs.String("o", "", "write the policy here (default: standard output)")
	pos, err := in.exactly(1)
	if err != nil {
		return err
	}
	switch {
	case *pool == "":
		return in.usageError("--pool is required")
	case len(dbx) == 0 && *sbat == "":
		return in.usageError("nothing to revoke: give --dbx-update or --sbat-level")
	case *requireDBX && len(dbx) == 0:
		return in.usageError("--require-dbx requires the hashes of a --dbx-update")
	}
	doc, err := os.ReadFile(pos[0])
	if err != nil {
		return err
	}
	var r policy.Revocations
	for _, f := range dbx {
		u, err := readDBXUpdate(f)
		if err != nil {
			return err
		}
		describeUpdate(in.stderr, f, u)
		for _, h := range u.SHA256 {
			d := hex.EncodeToString(h[:])
			r.DeniedDigests = append(r.DeniedDigests, d)
			if *requireDBX {
				r.RequireDBX = append(r.RequireDBX, d)
			}
		}
		for _, c := range u.Certificates {
			r.DeniedSigners = append(r.DeniedSigners, uefivar.Fingerprint(c))
		}
	}
	if *sbat != "" {
		gens, err := readSBATLevel(*sbat, in.stderr)
		if err != nil {
			return err
		}
		r.MinimumSBAT = gens
	}
	newDoc, notes, err := policy.AddRevocations(doc, *pool, r)
	if err != nil {
		return err
	}
	if len(notes) == 0 {
		fmt.Fprintf(in.stderr, "pools.%s: already holds every revocation read: nothing changed\n", *pool)
	}
	for _, n := range notes {
		fmt.Fprintln(in.stderr, "note:", n)
	}
	if *out == "" {
		_, err := in.stdout.Write(newDoc)
		return err
	}
	if err := fsutil.WriteFileAtomic(*out, newDoc, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(in.stderr, "wrote %s\n", *out)
	return nil
}

func readDBXUpdate(file string) (*uefivar.Update, error) {
	b, err := fsutil.ReadFileMax(file, uefivar.MaxSize)
	if err != nil {
		return nil, fmt.Errorf("--dbx-update %s: %w", file, err)
	}
	u, err := uefivar.ParseUpdate(b)
	if err != nil {
		return nil, fmt.Errorf("--dbx-update %s: %w", file, err)
	}
	return u, nil
}

// describeUpdate says what an update held and what of it becomes rules.
func describeUpdate(w io.Writer, file string, u *uefivar.Update) {
	if u.Authenticated {
		when := "no time"
		if !u.Time.IsZero() {
			when = u.Time.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%s: an authenticated variable (EFI_VARIABLE_AUTHENTICATION_2, %s)", file, when)
		if u.Signer != nil {
			fmt.Fprintf(w, " signed by %q (issuer %q)", safetext.Clean(u.Signer.Subject.String()), safetext.Clean(u.Signer.Issuer.String()))
		} else {
			fmt.Fprintf(w, " whose signer is not known (%s)", safetext.Clean(u.SignatureErr.Error()))
		}
		fmt.Fprintln(w, ": the signature is read, not verified: trust the file for where you got it")
	} else {
		fmt.Fprintf(w, "%s: bare EFI_SIGNATURE_LISTs (no authentication header, no signature)\n", file)
	}
	fmt.Fprintf(w, "  %d image hash(es) (EFI_CERT_SHA256): tpm.deniedDigests\n", len(u.SHA256))
	for _, c := range u.Certificates {
		fmt.Fprintf(w, "  certificate %q %s (EFI_CERT_X509): tpm.deniedSigners\n", safetext.Clean(c.Subject.String()), uefivar.Fingerprint(c))
	}
	others := make([]string, 0, len(u.Other))
	for typ := range u.Other {
		others = append(others, typ)
	}
	slices.Sort(others)
	for _, typ := range others {
		fmt.Fprintf(w, "  %d %s entr(ies): not turned into rules (the event log names neither)\n", u.Other[typ], typ)
	}
}

// efivarfsAttributes is the size of the attributes efivarfs puts before a
// variable's data (a copy of /sys/firmware/efi/efivars/SbatLevelRT-…).
const efivarfsAttributes = 4

// readSBATLevel reads an SbatLevel text (a copy of the SbatLevelRT
// variable from efivarfs, whose 4 bytes of attributes come first, too).
func readSBATLevel(file string, stderr io.Writer) (map[string]int, error) {
	b, err := fsutil.ReadFileMax(file, 64<<10)
	if err != nil {
		return nil, fmt.Errorf("--sbat-level %s: %w", file, err)
	}
	if !bytes.HasPrefix(b, []byte("sbat,")) && len(b) > efivarfsAttributes && bytes.HasPrefix(b[efivarfsAttributes:], []byte("sbat,")) {
		b = b[efivarfsAttributes:]
		fmt.Fprintf(stderr, "%s: an efivarfs copy: its 4 bytes of attributes skipped\n", file)
	}
	date, gens, err := tpm.ParseSBATLevel(b)
	if err != nil {
		return nil, fmt.Errorf("--sbat-level %s: not an SbatLevel: %w", file, err)
	}
	if len(gens) == 0 {
		return nil, fmt.Errorf("--sbat-level %s: SbatLevel %s revokes nothing (no component lines)", file, date)
	}
	comps := make([]string, 0, len(gens))
	for c := range gens {
		comps = append(comps, fmt.Sprintf("%s %d", c, gens[c]))
	}
	slices.Sort(comps)
	fmt.Fprintf(stderr, "%s: SbatLevel of %s: %s: tpm.minimumSBAT\n", file, date, strings.Join(comps, ", "))
	return gens, nil
}
