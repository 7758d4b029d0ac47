// Command attacktable reads `go test -json` output on stdin and prints the
// attack rows it carries (package attacktable) as one markdown table, with
// totals. It exits 1 if a row failed, a test failed, or there are no rows.
//
//	go test -json -count=1 -run Attack ./... | go run ./internal/attacktable/cmd/attacktable [-o file]
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/nodeproof/nodeproof/internal/attacktable"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

func main() {
	out := flag.String("o", "", "also write the table here")
	flag.Parse()
	rows, failed, err := read(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "attacktable:", err)
		os.Exit(1)
	}
	table := render(rows, failed)
	fmt.Print(table)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(table), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "attacktable:", err)
			os.Exit(1)
		}
	}
	bad := len(failed) > 0 || len(rows) == 0
	for _, r := range rows {
		bad = bad || !r.OK
	}
	if bad {
		os.Exit(1)
	}
}

// read collects rows (in order, once each) and the tests that failed.
func read(r io.Reader) ([]attacktable.Row, []string, error) {
	var rows []attacktable.Row
	var failed []string
	// A line of output may arrive in pieces; join per test.
	partial := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue // go build output and the like
		}
		switch e.Action {
		case "output":
			key := e.Package + " " + e.Test
			text := partial[key] + e.Output
			for {
				i := strings.IndexByte(text, '\n')
				if i < 0 {
					break
				}
				if row, ok := attacktable.Parse(text[:i]); ok {
					rows = append(rows, row)
				}
				text = text[i+1:]
			}
			partial[key] = text
		case "fail":
			if e.Test != "" {
				failed = append(failed, e.Package+" "+e.Test)
			} else {
				failed = append(failed, e.Package)
			}
		}
	}
	return rows, failed, sc.Err()
}

func render(rows []attacktable.Row, failed []string) string {
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Area < rows[j].Area })
	var b strings.Builder
	// A summary per area, then every row.
	type tally struct{ n, ok int }
	per := map[string]*tally{}
	var areas []string
	for _, r := range rows {
		t := per[r.Area]
		if t == nil {
			t = &tally{}
			per[r.Area] = t
			areas = append(areas, r.Area)
		}
		t.n++
		if r.OK {
			t.ok++
		}
	}
	b.WriteString("| area | rows | as expected |\n|---|---|---|\n")
	total, ok := 0, 0
	for _, a := range areas {
		fmt.Fprintf(&b, "| %s | %d | %d |\n", esc(a), per[a].n, per[a].ok)
		total, ok = total+per[a].n, ok+per[a].ok
	}
	fmt.Fprintf(&b, "| **all** | **%d** | **%d** |\n\n", total, ok)
	b.WriteString("| area | attack or fault | expected | got | as expected |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		res := "yes"
		if !r.OK {
			res = "**NO**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", esc(r.Area), esc(r.Attack), esc(r.Want), esc(r.Got), res)
	}
	fmt.Fprintf(&b, "\n%d rows, %d as expected, %d not.\n", total, ok, total-ok)
	if len(failed) > 0 {
		fmt.Fprintf(&b, "Failed tests: %s\n", strings.Join(failed, ", "))
	}
	return b.String()
}

func esc(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
