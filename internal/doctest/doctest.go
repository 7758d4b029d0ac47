// Package doctest reads the code blocks of the project's docs that tests
// run, so that a document cannot drift from what works: a fenced block
// whose info string names it, as in
//
//	```yaml example:tpm
//	...
//	```
//
// (GitHub renders the first word as the language and ignores the rest).
package doctest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
)

// Block is one named code block of a document.
type Block struct {
	Name string // after "example:"
	Lang string // the info string's first word
	Text string // the block's lines, each ending in a newline
	Line int    // the line of its opening fence, from 1
}

// Blocks returns the named blocks of the Markdown file path, in order. A
// name given twice, or a fence left open, is an error.
func Blocks(path string) ([]Block, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Block
	seen := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var cur *Block
	var fence string
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if cur == nil && fence == "" {
			if f, info, ok := openFence(trimmed); ok {
				fence = f
				fields := strings.Fields(info)
				for _, w := range fields[min(1, len(fields)):] {
					if name, ok := strings.CutPrefix(w, "example:"); ok {
						if prev, dup := seen[name]; dup {
							return nil, fmt.Errorf("%s:%d: block %q is named again (line %d)", path, n, name, prev)
						}
						seen[name] = n
						cur = &Block{Name: name, Lang: fields[0], Line: n}
					}
				}
			}
			continue
		}
		if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
			if cur != nil {
				out = append(out, *cur)
			}
			cur, fence = nil, ""
			continue
		}
		if cur != nil {
			cur.Text += line + "\n"
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if fence != "" {
		return nil, fmt.Errorf("%s: a code fence is left open at the end", path)
	}
	return out, nil
}

// openFence reports a line opening a fenced code block: its fence
// (``` or ~~~, or longer) and info string.
func openFence(line string) (fence, info string, ok bool) {
	for _, c := range []string{"`", "~"} {
		if strings.HasPrefix(line, c+c+c) {
			i := 0
			for i < len(line) && line[i:i+1] == c {
				i++
			}
			return line[:i], strings.TrimSpace(line[i:]), true
		}
	}
	return "", "", false
}

// Named returns the block called name of path; an error if there is none.
func Named(path, name string) (Block, error) {
	bs, err := Blocks(path)
	if err != nil {
		return Block{}, err
	}
	for _, b := range bs {
		if b.Name == name {
			return b, nil
		}
	}
	return Block{}, fmt.Errorf("%s has no block named example:%s", path, name)
}
