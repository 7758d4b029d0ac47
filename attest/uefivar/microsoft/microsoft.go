// Package microsoft holds Microsoft's Secure Boot certificates as data:
// the 2011 CAs (expiring in 2026) and the 2023 CAs that replace them, as
// DER files (certs/, README.md says where each came from), each with the
// database it belongs in and the generation it is of. What a node's db
// and KEK hold, and which CA verified its boot chain, are judged against
// these (the 2023 transition: issue 41).
package microsoft

import (
	"crypto/x509"
	"embed"
	"fmt"

	"github.com/nodeproof/nodeproof/attest/uefivar"
)

//go:embed certs/*.der
var files embed.FS

// The databases a certificate belongs in.
const (
	KEK = "KEK"
	DB  = "db"
)

// CA is one of Microsoft's Secure Boot CAs.
type CA struct {
	// Name is the certificate's common name.
	Name string
	// Variable is where it is enrolled: KEK or DB.
	Variable string
	// Year is its generation: 2011 or 2023.
	Year int
	// Signs says what it signs.
	Signs string
	// Cert is the certificate; SHA256 its fingerprint (hex), as PCR 7's
	// authorities and policies name it.
	Cert   *x509.Certificate
	SHA256 string
}

// table is every CA: its file, then what it is.
// Each row's fingerprint is the SHA-256 of its file (CAs checks it), so
// that what a node's PCR 7 names can be matched without parsing anything.
var table = []struct {
	file, name, variable string
	year                 int
	signs                string
	sha256               string
}{
	{"microsoft-corporation-kek-ca-2011.der", "Microsoft Corporation KEK CA 2011", KEK, 2011, "db and dbx updates",
		"a1117f516a32cefcba3f2d1ace10a87972fd6bbe8fe0d0b996e09e65d802a503"},
	{"microsoft-windows-production-pca-2011.der", "Microsoft Windows Production PCA 2011", DB, 2011, "Windows' boot manager",
		"e8e95f0733a55e8bad7be0a1413ee23c51fcea64b3c8fa6a786935fddcc71961"},
	{"microsoft-corporation-uefi-ca-2011.der", "Microsoft Corporation UEFI CA 2011", DB, 2011, "third parties' boot applications (shims) and option ROMs",
		"48e99b991f57fc52f76149599bff0a58c47154229b9f8d603ac40d3500248507"},
	{"microsoft-corporation-kek-2k-ca-2023.der", "Microsoft Corporation KEK 2K CA 2023", KEK, 2023, "db and dbx updates",
		"3cd3f0309edae228767a976dd40d9f4affc4fbd5218f2e8cc3c9dd97e8ac6f9d"},
	{"windows-uefi-ca-2023.der", "Windows UEFI CA 2023", DB, 2023, "Windows' boot manager",
		"076f1fea90ac29155ebf77c17682f75f1fdd1be196da302dc8461e350a9ae330"},
	{"microsoft-uefi-ca-2023.der", "Microsoft UEFI CA 2023", DB, 2023, "third parties' boot applications (shims)",
		"f6124e34125bee3fe6d79a574eaa7b91c0e7bd9d929c1a321178efd611dad901"},
}

// CAs returns every CA, read from the embedded files: each must parse,
// carry the common name the table gives it and have its fingerprint.
func CAs() ([]CA, error) {
	out := make([]CA, 0, len(table))
	for _, r := range table {
		der, err := files.ReadFile("certs/" + r.file)
		if err != nil {
			return nil, err
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.file, err)
		}
		if c.Subject.CommonName != r.name {
			return nil, fmt.Errorf("%s: the certificate is %q, not %q", r.file, c.Subject.CommonName, r.name)
		}
		if fp := uefivar.Fingerprint(c); fp != r.sha256 {
			return nil, fmt.Errorf("%s: fingerprint %s, the table says %s", r.file, fp, r.sha256)
		}
		out = append(out, CA{Name: r.name, Variable: r.variable, Year: r.year, Signs: r.signs, Cert: c, SHA256: r.sha256})
	}
	return out, nil
}
