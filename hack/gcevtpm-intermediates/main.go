// Command gcevtpm-intermediates refreshes the GCE vTPM intermediates
// identity/gcevtpm ships (identity/gcevtpm/certs/README.md): it fetches
// every certificate sources.txt lists, or with -from the issuers an AK
// certificate names, over AIA within gcevtpm.AIA's bounds (Google's
// hosts only, 10 s, 64 KiB, no redirects), keeps each only if it chains
// to a pinned root, and writes it as PEM. Review the diff and commit.
//
//	go run ./hack/gcevtpm-intermediates [-dir identity/gcevtpm/certs] [-from ak.der]
package main

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/fsutil"
	"github.com/nodeproof/nodeproof/identity/gcevtpm"
)

func main() {
	dir := flag.String("dir", "identity/gcevtpm/certs", "the certs directory (sources.txt, roots/, intermediates/)")
	from := flag.String("from", "", "an AK certificate (DER or PEM) whose issuers to fetch and add, instead of refreshing sources.txt")
	hosts := flag.String("aia-hosts", strings.Join(gcevtpm.DefaultAIAHosts, ","), "comma-separated exact hosts to fetch from (add the bucket host an AK certificate names)")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := &gcevtpm.AIA{AllowedHosts: strings.Split(*hosts, ",")}
	var err error
	if *from != "" {
		err = addFrom(ctx, a, *dir, *from, time.Now())
	} else {
		err = refresh(ctx, a, *dir, time.Now())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gcevtpm-intermediates:", err)
		os.Exit(1)
	}
}

// refresh fetches every "file URL" line of dir/sources.txt and writes
// each certificate to dir/intermediates/file, after checking it chains to
// a pinned root (through the others).
func refresh(ctx context.Context, a *gcevtpm.AIA, dir string, now time.Time) error {
	f, err := os.Open(filepath.Join(dir, "sources.txt"))
	if err != nil {
		return err
	}
	defer f.Close()
	got := map[string]*x509.Certificate{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, url, ok := strings.Cut(line, " ")
		if !ok || filepath.Base(name) != name || !strings.HasSuffix(name, ".pem") {
			return fmt.Errorf("sources.txt: %q is not \"file.pem URL\"", line)
		}
		c, err := a.Fetch(ctx, strings.TrimSpace(url))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		got[name] = c
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return write(dir, got, now)
}

// addFrom adds the issuers the AK certificate at path names (walking AIA
// up to a pinned root's child).
func addFrom(ctx context.Context, a *gcevtpm.AIA, dir, path string, now time.Time) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if blk, _ := pem.Decode(b); blk != nil {
		b = blk.Bytes
	}
	leaf, err := x509.ParseCertificate(b)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	tr, err := gcevtpm.DefaultTrust(now)
	if err != nil {
		return err
	}
	issuers, err := a.Issuers(ctx, leaf, tr.Roots())
	if err != nil {
		return err
	}
	if len(issuers) == 0 {
		return errors.New("the certificate's issuer is a pinned root or names no AIA URL: nothing to add")
	}
	got := map[string]*x509.Certificate{}
	for _, c := range issuers {
		if c.IsCA && string(c.RawIssuer) != string(c.RawSubject) {
			got[fileName(c)] = c
		}
	}
	return write(dir, got, now)
}

// fileName names a fetched intermediate by its subject key ID.
func fileName(c *x509.Certificate) string {
	return fmt.Sprintf("intermediate_%x.pem", c.SubjectKeyId)
}

// write checks that the trust made of the pinned roots, the intermediates
// already in dir and got holds (every intermediate chains to a root), then
// writes got.
func write(dir string, got map[string]*x509.Certificate, now time.Time) error {
	tr, err := gcevtpm.DefaultTrust(now)
	if err != nil {
		return err
	}
	all := append([]*x509.Certificate(nil), tr.Intermediates()...)
	for _, c := range got {
		all = append(all, c)
	}
	if _, err := gcevtpm.NewTrust(tr.Roots(), all, now); err != nil {
		return err
	}
	for name, c := range got {
		p := filepath.Join(dir, "intermediates", name)
		if err := fsutil.WriteFileAtomic(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}), 0o644); err != nil {
			return err
		}
		fmt.Printf("%s: %s, valid to %s\n", p, c.Subject.CommonName, c.NotAfter.UTC().Format("2006-01-02"))
	}
	return nil
}
