// Package proc reads what the benchmarks report of a process from Linux's
// /proc: CPU time and peak resident memory, and finds the processes to
// measure.
package proc

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// CPU is the CPU time of pid's threads so far: the sum of their scheduler
// run times (/proc/PID/task/*/schedstat, nanoseconds), else user+system
// time in clock ticks (/proc/PID/stat, 10 ms). 0 if pid is gone.
func CPU(pid int) time.Duration {
	if tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid)); len(tasks) > 0 {
		var sum time.Duration
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue // the thread exited
			}
			if f := strings.Fields(string(b)); len(f) > 0 {
				ns, _ := strconv.ParseInt(f[0], 10, 64)
				sum += time.Duration(ns)
			}
		}
		return sum
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// SumCPU is CPU summed over pids.
func SumCPU(pids []int) time.Duration {
	var d time.Duration
	for _, p := range pids {
		d += CPU(p)
	}
	return d
}

// PeakRSS is VmHWM of pid in bytes.
func PeakRSS(pid int) int64 { return status(pid, "VmHWM:") }

// RSS is VmRSS of pid in bytes: its resident set now.
func RSS(pid int) int64 { return status(pid, "VmRSS:") }

// status is a kB field of pid's /proc status, in bytes (0 if unknown).
func status(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field) {
			kb, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// Find returns the pid of a process whose executable is named name and
// whose command line mentions hint (0 if none).
func Find(name, hint string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmd), "\x00")
		if len(args) > 0 && filepath.Base(args[0]) == name && strings.Contains(string(cmd), hint) {
			return pid
		}
	}
	return 0
}

// ChildrenNamed returns the pids of this process's children whose command
// name is one of names (envtest's etcd and kube-apiserver).
func ChildrenNamed(names ...string) []int {
	self := os.Getpid()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var pids []int
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < 0 {
			continue
		}
		comm := s[open+1 : closing]
		f := strings.Fields(s[closing+2:])
		ppid, _ := strconv.Atoi(f[1])
		if ppid != self {
			continue
		}
		for _, n := range names {
			if comm == n {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
				pids = append(pids, pid)
			}
		}
	}
	return pids
}
