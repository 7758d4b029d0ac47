// Package inspecttest is the tests' way of waiting on `nodeproof inspect`:
// Until runs it until a node's story holds what the test wants (the
// end-to-end and live-boot suites use it).
package inspecttest

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
)

// TB is what Until needs of a test (testing.TB fits).
type TB interface {
	Helper()
	Fatal(args ...any)
}

// Until runs `nodeproof inspect NODE -o json` through run (the
// test's way of running the nodeproof command: its arguments in, its
// output out) until want says nothing is missing (want returns what is),
// for at most d, and returns that story.
func Until(t TB, run func(args ...string) string, node string, d time.Duration, want func(*inspect.Story) string) *inspect.Story {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		out := run("inspect", node, "-o", "json")
		var s inspect.Story
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatal(fmt.Sprintf("nodeproof inspect %s -o json: %v\n%s", node, err, out))
		}
		missing := want(&s)
		if missing == "" {
			return &s
		}
		if time.Now().After(deadline) {
			t.Fatal(fmt.Sprintf("nodeproof inspect %s lacks %s after %s:\n%s", node, missing, d, out))
		}
		time.Sleep(250 * time.Millisecond)
	}
}
