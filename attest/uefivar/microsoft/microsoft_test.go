package microsoft_test

import (
	"bytes"
	"testing"
	"unicode/utf16"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	"github.com/nodeproof/nodeproof/attest/uefivar"
	"github.com/nodeproof/nodeproof/attest/uefivar/microsoft"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// measured is the certificates (by fingerprint) a real log measured in a
// signature database's variable (PCR 7, EV_EFI_VARIABLE_DRIVER_CONFIG),
// read with go-eventlog and attest/uefivar.
func measured(t *testing.T, log, variable string) map[string][]byte {
	t.Helper()
	el, err := tcg.ParseEventLog(firmwaretestdata.MustLog(log), tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, ev := range el.Events(register.HashSHA256) {
		if ev.Index != 7 || ev.Type != tcg.EFIVariableDriverConfig {
			continue
		}
		v, err := tcg.ParseUEFIVariableData(bytes.NewReader(ev.Data))
		if err != nil || string(utf16.Decode(v.UnicodeName)) != variable {
			continue
		}
		l, err := uefivar.ParseLists(v.VariableData)
		if err != nil {
			t.Fatalf("%s %s: %v", log, variable, err)
		}
		for _, c := range l.Certificates {
			out[uefivar.Fingerprint(c)] = c.Raw
		}
	}
	return out
}

// TestCAs: every CA is the one its row names, enrolled where the row says
// in a real machine's measured databases (the 2011 set on an Arch Linux
// workstation, the 2023 set on a GCE TDX VM of 2024), byte for byte; the
// 2011 set expires in 2026, the 2023 set was issued in 2023.
func TestCAs(t *testing.T) {
	cas, err := microsoft.CAs()
	if err != nil {
		t.Fatal(err)
	}
	source := map[int]string{2011: "arch-linux-workstation", 2023: "ubuntu-2404-intel-tdx"}
	want := map[string]string{
		"Microsoft Corporation KEK CA 2011":     "a1117f516a32cefcba3f2d1ace10a87972fd6bbe8fe0d0b996e09e65d802a503",
		"Microsoft Windows Production PCA 2011": "e8e95f0733a55e8bad7be0a1413ee23c51fcea64b3c8fa6a786935fddcc71961",
		"Microsoft Corporation UEFI CA 2011":    "48e99b991f57fc52f76149599bff0a58c47154229b9f8d603ac40d3500248507",
		"Microsoft Corporation KEK 2K CA 2023":  "3cd3f0309edae228767a976dd40d9f4affc4fbd5218f2e8cc3c9dd97e8ac6f9d",
		"Windows UEFI CA 2023":                  "076f1fea90ac29155ebf77c17682f75f1fdd1be196da302dc8461e350a9ae330",
		"Microsoft UEFI CA 2023":                "f6124e34125bee3fe6d79a574eaa7b91c0e7bd9d929c1a321178efd611dad901",
	}
	if len(cas) != len(want) {
		t.Fatalf("%d CAs; want %d", len(cas), len(want))
	}
	for _, ca := range cas {
		t.Run(ca.Name, func(t *testing.T) {
			if ca.SHA256 != want[ca.Name] {
				t.Fatalf("fingerprint %s; want %s", ca.SHA256, want[ca.Name])
			}
			der, ok := measured(t, source[ca.Year], ca.Variable)[ca.SHA256]
			if !ok || !bytes.Equal(der, ca.Cert.Raw) {
				t.Fatalf("%s's %s does not hold it", source[ca.Year], ca.Variable)
			}
			switch ca.Year {
			case 2011:
				if ca.Cert.NotAfter.Year() != 2026 {
					t.Errorf("a 2011 CA valid until %v", ca.Cert.NotAfter)
				}
			case 2023:
				if ca.Cert.NotBefore.Year() != 2023 {
					t.Errorf("a 2023 CA issued %v", ca.Cert.NotBefore)
				}
			default:
				t.Errorf("year %d", ca.Year)
			}
		})
	}
}
