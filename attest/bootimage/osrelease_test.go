package bootimage

import (
	"strings"
	"testing"
)

func TestParseOSRelease(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     OSRelease
		err      bool
	}{
		{"Debian's", "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"12\"\nID=debian\n", OSRelease{ID: "debian", VersionID: "12", PrettyName: "Debian GNU/Linux 12 (bookworm)"}, false},
		{"comments, blank lines, NUL padding", "# a comment\n\n  ID=fedora  \n#ID=other\nVERSION_ID=40\x00\x00", OSRelease{ID: "fedora", VersionID: "40"}, false},
		{"single quotes keep backslashes", `PRETTY_NAME='a \" b'`, OSRelease{PrettyName: `a \" b`}, false},
		{"double quotes unescape", `PRETTY_NAME="say \"hi\" \$HOME \\ \n"`, OSRelease{PrettyName: `say "hi" $HOME \ \n`}, false},
		{"unquoted escapes", `IMAGE_ID=a\ b`, OSRelease{ImageID: "a b"}, false},
		{"image fields", "IMAGE_ID=node\nIMAGE_VERSION=\"7\"", OSRelease{ImageID: "node", ImageVersion: "7"}, false},
		{"a key twice", "ID=debian\nID=fedora\n", OSRelease{}, true},
		{"no =", "ID debian\n", OSRelease{}, true},
		{"a bad key", "1D=debian\n", OSRelease{}, true},
		{"an unclosed double quote", `PRETTY_NAME="abc`, OSRelease{}, true},
		{"an unclosed single quote", `PRETTY_NAME='abc`, OSRelease{}, true},
		{"text after the quote", `PRETTY_NAME="abc"def`, OSRelease{}, true},
		{"a comment after the value", `ID=debian # the id`, OSRelease{}, true},
		{"an unquoted space", `PRETTY_NAME=Debian 12`, OSRelease{}, true},
		{"an unescaped $ in double quotes", `PRETTY_NAME="$(reboot)"`, OSRelease{}, true},
		{"a NUL inside", "ID=deb\x00ian\nVERSION_ID=1", OSRelease{}, true},
		{"not UTF-8", "ID=\xff\n", OSRelease{}, true},
		{"too many lines", strings.Repeat("\n", maxOSReleaseLines+1), OSRelease{}, true},
		{"too long", "HOME_URL=" + strings.Repeat("a", maxOSRelease), OSRelease{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseOSRelease([]byte(tc.in))
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("%+v, %v; want %+v, error %v", got, err, tc.want, tc.err)
			}
		})
	}
}

// FuzzOSRelease: any text is read or refused, never a panic; what reads
// reads the same again when written back as os-release in double quotes.
func FuzzOSRelease(f *testing.F) {
	f.Add([]byte("PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"12\"\nID=debian\n"))
	f.Add([]byte("# c\nIMAGE_ID='a \\ b'\nIMAGE_VERSION=\"x\\\"y\\$\"\nID=a\\ b\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := parseOSRelease(b)
		if err != nil {
			return
		}
		q := func(s string) string {
			r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`, "`", "\\`")
			return `"` + r.Replace(s) + `"`
		}
		var w strings.Builder
		for _, kv := range [][2]string{{"ID", got.ID}, {"VERSION_ID", got.VersionID}, {"PRETTY_NAME", got.PrettyName}, {"IMAGE_ID", got.ImageID}, {"IMAGE_VERSION", got.ImageVersion}} {
			if kv[1] != "" && !strings.Contains(kv[1], "\n") {
				w.WriteString(kv[0] + "=" + q(kv[1]) + "\n")
			}
		}
		back, err := parseOSRelease([]byte(w.String()))
		if err != nil {
			t.Fatalf("%+v written back as %q: %v", got, w.String(), err)
		}
		for _, p := range [][2]string{{got.ID, back.ID}, {got.VersionID, back.VersionID}, {got.PrettyName, back.PrettyName}, {got.ImageID, back.ImageID}, {got.ImageVersion, back.ImageVersion}} {
			if p[0] != p[1] && !strings.Contains(p[0], "\n") {
				t.Fatalf("%+v read back as %+v", got, back)
			}
		}
	})
}
