package systemtest

import "context"

// T is what New needs of a test (testing.TB fits).
type T interface {
	TB
	TempDir() string
}

// New is Start for a test: the world lives in the test's temporary
// directory and stops when the test ends; the module root is root (the
// test's path to it, e.g. "../..").
func New(t T, root string, o Options) *World {
	t.Helper()
	o.Root, o.Dir = root, t.TempDir()
	if o.Cloud && o.Fakes == nil {
		o.Fakes = t
	}
	w, err := Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w
}
