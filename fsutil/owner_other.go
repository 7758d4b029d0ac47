//go:build !unix

package fsutil

import "os"

// Owner cannot be read here.
func Owner(os.FileInfo) (int, bool) { return 0, false }
