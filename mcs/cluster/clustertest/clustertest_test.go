package clustertest_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
)

// TestLaunchWithCommandPrefix: with a CommandPrefix, etcd and
// kube-apiserver run through it (a recorder in a directory whose name
// needs quoting), as the processes envtest started (the prefix execs them:
// same PID, their own name), the API server answers, and Stop ends them.
func TestLaunchWithCommandPrefix(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "it's a prefix")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	record, log := filepath.Join(dir, "record"), filepath.Join(dir, "log")
	// record LOG -- BIN ARGS...: logs its PID and BIN, then becomes BIN.
	script := "#!/bin/sh\nlog=$1; shift 2\necho \"$$ $1\" >>\"$log\"\nexec \"$@\"\n"
	if err := os.WriteFile(record, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}

	e, err := clustertest.LaunchWith(t.TempDir(), clustertest.LaunchOptions{CommandPrefix: []string{record, log, "--"}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			e.Stop()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if u, err := clustertest.WhoAmI(ctx, e.Config); err != nil || u.Username == "" {
		t.Fatalf("the API server through the prefix: %+v, %v", u, err)
	}

	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	running := map[string][]int{} // binary name -> PIDs the prefix ran it as that still run it
	var all []int
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		pidText, bin, ok := strings.Cut(line, " ")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil {
			t.Fatalf("recorder log line %q", line)
		}
		all = append(all, pid)
		if comm, err := os.ReadFile("/proc/" + pidText + "/comm"); err == nil && strings.TrimSpace(string(comm)) == filepath.Base(bin) {
			running[filepath.Base(bin)] = append(running[filepath.Base(bin)], pid)
		}
	}
	for _, name := range []string{"etcd", "kube-apiserver"} {
		if len(running[name]) != 1 {
			t.Errorf("%s: running as PIDs %v of the prefix's (log:\n%s); want one", name, running[name], b)
		}
	}

	stopped = true
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range all {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("PID %d the prefix ran still exists after Stop (kill 0: %v)", pid, err)
		}
	}
}
