//go:build !linux

package demo

// dieWithParent: parent-death signals are Linux's; elsewhere programs run
// as they are (no prefix).
func dieWithParent() ([]string, error) { return nil, nil }
