//go:build unix

package fsutil

import (
	"os"
	"syscall"
)

// Owner is the uid that owns what fi describes.
func Owner(fi os.FileInfo) (int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
