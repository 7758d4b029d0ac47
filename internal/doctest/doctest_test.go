package doctest

import (
	"os"
	"path/filepath"
	"testing"
)

func TestBlocks(t *testing.T) {
	doc := "# t\n\n```yaml example:one\na: 1\n```\n\n```sh\nnot named\n```\n\n````sh example:two\n```\ninner\n````\n~~~yaml\n~~~\n"
	p := filepath.Join(t.TempDir(), "d.md")
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	bs, err := Blocks(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 2 || bs[0].Name != "one" || bs[0].Lang != "yaml" || bs[0].Text != "a: 1\n" || bs[0].Line != 3 ||
		bs[1].Name != "two" || bs[1].Text != "```\ninner\n" {
		t.Fatalf("blocks %+v", bs)
	}
	if _, err := Named(p, "three"); err == nil {
		t.Error("a missing block was found")
	}
	for name, bad := range map[string]string{
		"a name given twice": "```yaml example:x\n```\n```yaml example:x\n```\n",
		"a fence left open":  "```yaml example:x\nfoo\n",
	} {
		if err := os.WriteFile(p, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Blocks(p); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
