package boltstore

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// holder names the process holding a lock on the file at path, from
// /proc/locks (matched by the file's device and inode): "pid N (its
// command line)", or "" when none is found.
func holder(path string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return ""
	}
	f, err := os.Open("/proc/locks")
	if err != nil {
		return ""
	}
	defer f.Close()
	// "1: FLOCK  ADVISORY  WRITE 12345 08:01:1234567 0 EOF": the device
	// as major:minor in hex, the inode in decimal.
	major, minor := (st.Dev>>8)&0xfff|(st.Dev>>32)&^0xfff, st.Dev&0xff|(st.Dev>>12)&^0xff
	want := fmt.Sprintf("%02x:%02x:%d", major, minor, st.Ino)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] == "->" {
			continue // a waiter's line
		}
		if fields[5] != want {
			continue
		}
		pid, err := strconv.Atoi(fields[4])
		if err != nil || pid <= 0 {
			continue
		}
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		line := strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
		if len(line) > 200 {
			line = line[:200] + "…"
		}
		if line == "" {
			return fmt.Sprintf("pid %d", pid)
		}
		return fmt.Sprintf("pid %d (%s)", pid, line)
	}
	return ""
}
