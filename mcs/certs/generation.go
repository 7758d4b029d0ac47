package certs

// A generation on disk: the material as files, and back.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/nodeproof/nodeproof/pemcert"
)

type fileData struct {
	data []byte
	mode os.FileMode
}

func (m *material) render() map[string]fileData {
	f := map[string]fileData{
		CABundleFileName:    {encodeCerts(m.bundle...), 0o644},
		CACertFileName:      {encodeCerts(m.ca), 0o644},
		CAKeyFileName:       {m.caKeyPEM, 0o600},
		ServingKeyFileName:  {m.leafPEM, 0o600},
		ServingCertFileName: {encodeCerts(m.leaf), 0o644},
	}
	if m.cross != nil {
		f[CACrossFileName] = fileData{encodeCerts(m.cross), 0o644}
		f[ServingCertFileName] = fileData{encodeCerts(m.leaf, m.cross), 0o644}
	}
	return f
}

func sameFiles(old map[string][]byte, next map[string]fileData) bool {
	if len(old) != len(next) {
		return false
	}
	for name, f := range next {
		b, ok := old[name]
		if !ok || string(b) != string(f.data) {
			return false
		}
	}
	return true
}

// Files is one generation's content by file name ([CABundleFileName],
// [CACertFileName], ...): what a generation directory holds, or what
// another keeper of the state (the cluster's objects, mcs/certs/kubecerts)
// maps to its own places.
type Files map[string][]byte

// Where names the place a file of a generation is kept, for errors: a path
// in directory mode, an object and its key in the cluster.
type Where func(name string) string

// load reads a generation directory.
func load(gdir string) (*material, error) {
	files := Files{}
	for _, name := range []string{CABundleFileName, CACertFileName, CAKeyFileName, CACrossFileName, ServingCertFileName, ServingKeyFileName} {
		b, err := os.ReadFile(filepath.Join(gdir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("certs: %w", err)
		}
		files[name] = b
	}
	where := func(name string) string { return filepath.Join(gdir, name) }
	return loadFiles(files, where, fmt.Sprintf("restore it, or move %s aside to start over with a new CA", filepath.Dir(gdir)))
}

// loadFiles reads a generation. A damaged serving pair is reported in
// leafErr (Ensure replaces it); anything wrong on the CA side is an error
// naming where the file is kept, ending in hint.
func loadFiles(files Files, where Where, hint string) (*material, error) {
	m := &material{files: map[string][]byte{}}
	read := func(name string, optional bool) ([]byte, error) {
		b, ok := files[name]
		if !ok {
			if optional {
				return nil, nil
			}
			return nil, errors.New("missing")
		}
		m.files[name] = b
		return b, nil
	}
	caErr := func(name string, err error) error {
		return fmt.Errorf("certs: %s is unusable (%v); refusing to replace a CA that existing pointer configs may trust: %s",
			where(name), err, hint)
	}

	b, err := read(CABundleFileName, false)
	if err != nil {
		return nil, caErr(CABundleFileName, err)
	}
	if m.bundle, err = pemcert.Parse(b); err != nil {
		return nil, caErr(CABundleFileName, err)
	}
	b, err = read(CACertFileName, false)
	if err != nil {
		return nil, caErr(CACertFileName, err)
	}
	cas, err := pemcert.Parse(b)
	if err == nil && len(cas) != 1 {
		err = fmt.Errorf("%d certificates, want 1", len(cas))
	}
	if err != nil {
		return nil, caErr(CACertFileName, err)
	}
	m.ca = cas[0]
	if m.caKeyPEM, err = read(CAKeyFileName, false); err != nil {
		return nil, caErr(CAKeyFileName, err)
	}
	if m.caKey, err = parseKey(m.caKeyPEM, m.ca); err != nil {
		return nil, caErr(CAKeyFileName, err)
	}
	if !m.ca.IsCA {
		return nil, caErr(CACertFileName, errors.New("not a CA"))
	}
	if !slices.ContainsFunc(m.bundle, m.ca.Equal) {
		return nil, caErr(CABundleFileName, errors.New("it lacks the active CA"))
	}
	if b, err = read(CACrossFileName, true); err != nil {
		return nil, caErr(CACrossFileName, err)
	}
	if b != nil {
		crosses, err := pemcert.Parse(b)
		if err == nil && (len(crosses) != 1 || !samePublicKey(crosses[0].PublicKey, m.ca.PublicKey) ||
			string(crosses[0].RawSubject) != string(m.ca.RawSubject)) {
			err = errors.New("not the active CA's subject and key")
		}
		if err != nil {
			return nil, caErr(CACrossFileName, err)
		}
		m.cross = crosses[0]
	}

	// The serving pair: any damage is repaired by issuing a new one.
	chainPEM, err1 := read(ServingCertFileName, false)
	keyPEM, err2 := read(ServingKeyFileName, false)
	if err1 != nil || err2 != nil {
		m.leafErr = fmt.Errorf("%s or %s missing", where(ServingCertFileName), where(ServingKeyFileName))
		return m, nil
	}
	chain, err := pemcert.Parse(chainPEM)
	if err != nil {
		m.leafErr = fmt.Errorf("%s: %w", where(ServingCertFileName), err)
		return m, nil
	}
	key, err := parseKey(keyPEM, chain[0])
	if err != nil {
		m.leafErr = fmt.Errorf("%s: %w", where(ServingKeyFileName), err)
		return m, nil
	}
	m.leaf, m.leafKey, m.leafPEM = chain[0], key, keyPEM
	return m, nil
}
