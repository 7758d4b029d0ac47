package system

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
)

// InspectUntil runs `nodeproof inspect NODE -o json` through run (the
// test's way of running the nodeproof command: its arguments in, its
// output out) until want says nothing is missing (want returns what is),
// for at most d, and returns that story.
func InspectUntil(t TB, run func(args ...string) string, node string, d time.Duration, want func(*inspect.Story) string) *inspect.Story {
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
