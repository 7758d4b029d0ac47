//go:build !linux

package demo

// dieWithParent: parent-death signals are Linux's; elsewhere bin runs as is.
func dieWithParent(dir, bin string) (string, error) { return bin, nil }
