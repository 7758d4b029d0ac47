// Package bench_test runs every bench target of the Makefile for a few
// seconds, as a user types it (make bench-…), and checks that it exits 0
// (each target exits non-zero on any failed request, lost approval or
// failed machine) and produces its report. It never asserts a speed: the
// figures come from the full runs, as ratios against baselines measured
// in the same run (docs/scaling.md).
package bench_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/internal/testenv"
)

func TestBenchTargetsSmoke(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is not installed: apt-get install make")
	}
	testenv.KubebuilderAssets(t) // bench and bench-approver run a real API server
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		target string
		// args are make's command line (variables); {out} is the report
		// file. env is the environment the target reads.
		args, env []string
		// report must match the output (report file, or stdout if none).
		report []string
	}{
		{target: "bench-tpm", env: []string{"COUNT=1", "BENCHTIME=20x"},
			report: []string{`BenchmarkTPMAttestation/full`, `ratio [0-9.]+x`}},
		{target: "bench-cloud", env: []string{"ROUNDS=1", "BENCHTIME=20x"},
			report: []string{`(?m)^gcp +verify .* ratio [0-9.]+x`, `(?m)^aws +verify .* ratio [0-9.]+x`,
				`(?m)^gce-vtpm +verify .* ratio [0-9.]+x`, `(?m)^aws-nitrotpm +verify .* ratio [0-9.]+x`, `round 1 nitrotpm BenchmarkECDSAP384VerifyFloor`}},
		{target: "bench-mcs", args: []string{"BENCH_MCS_FLAGS=--duration 300ms --concurrency 1,4 --sources 50 -o {out}"},
			report: []string{`The serving path`, `A fleet`, `(?m)^\| 4 \|.*\| 0 \|$`, `peak RSS`}},
		{target: "bench", args: []string{"BENCH_FLAGS=-n 12 -gcp 2 -aws 2 -spread 1s -attest-only 10 -steady-rate 5 -steady-for 2s -o {out}"},
			report: []string{`\| approved \| 12 of 12 \|`, `\| errors \| 0 \|`, `\| lost / duplicated approvals \| 0 / 0 \|`,
				`(?m)^\| storm: every node at once \| 12 \|[^|]*\|[^|]*\| 0 \|`, `(?m)^\| steady: 5 a second for 2s \| 10 \|[^|]*\|[^|]*\| 0 \|`}},
		// A day (-hours): two compressed hours after the burst, with the
		// writes per node (7 at enrolment, 1 per re-attestation), the
		// bytes per node in etcd and the processes' memory; before the
		// second hour the policy changes three times and the fleet is
		// re-judged: the TPM nodes' kernel revoked fails the four of
		// them, the policy put back clears them.
		{target: "bench", args: []string{"BENCH_FLAGS=-n 6 -gcp 1 -aws 1 -spread 1s -hours 2 -hour 2s -policy-change-at 2 -o {out}"},
			report: []string{`\| approved \| 6 of 6 \|`, `(?m)^\| all 2 hours \| 12 \|[^|]*\|[^|]*\| 0 \|`,
				`(?m)^\| a revocation no node booted [^|]*\| 6 / 0 \| 0 / 0 \|`,
				`(?m)^\| the revocation of the kernel every TPM node booted \| 6 / 0 \| 4 / 0 \|`,
				`(?m)^\| the policy put back \| 6 / 0 \| 0 / 4 \|`,
				`(?m)^\| \*\*all, leases apart\*\* \| 7\.000 \| 1\.000 \| 31\.000 \|$`,
				`(?m)^\| NodeBinding \|[^|]*\| 6 / `, `(?m)^\| nodeproof approve: Go heap \|`}},
		{target: "bench-approver", args: []string{"BENCH_APPROVER_FLAGS=-n 8 -limits none -o {out}"},
			report: []string{`(?m)^\| none[^|]*\| nodeproof \|.*\| 0 \| 0 \| \d+ \|$`, `(?m)^\| none[^|]*\| baseline \|.*\| 0 \| 0 \| \d+ \|$`, `nodeproof / baseline`}},
	}
	for _, tc := range tests {
		t.Run(tc.target, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "report.md")
			args := []string{"-C", root, "--no-print-directory", tc.target}
			for _, a := range tc.args {
				args = append(args, strings.ReplaceAll(a, "{out}", out))
			}
			cmd := exec.Command("make", args...)
			cmd.Env = append(append(os.Environ(), "TMPDIR="+t.TempDir()), tc.env...)
			stdout, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("make %s: %v\n%s", strings.Join(args[3:], " "), err, stdout)
			}
			report := stdout
			if strings.Contains(strings.Join(tc.args, " "), "{out}") {
				if report, err = os.ReadFile(out); err != nil {
					t.Fatalf("make %s exited 0 but wrote no report: %v\n%s", tc.target, err, stdout)
				}
			}
			for _, re := range tc.report {
				if !regexp.MustCompile(re).Match(report) {
					t.Errorf("make %s: the report lacks %q:\n%s", tc.target, re, report)
				}
			}
		})
	}
}
