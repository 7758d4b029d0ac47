//go:build !linux

package boltstore

// holder cannot be found here.
func holder(string) string { return "" }
