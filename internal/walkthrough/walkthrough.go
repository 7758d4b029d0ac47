// Package walkthrough runs the operator's guide (docs/operations.md, "Your
// first day"): its named shell blocks, in a work directory laid out like
// the repository's top directory, with the built binaries on PATH, printing
// each command as bash runs it (xtrace, "$ " before each). The test of this
// package runs the whole guide, so the guide cannot stop working unnoticed;
// make demo runs its cluster part on a throwaway API server.
//
// Blocks run as the guide's reader runs them: one `bash -euo pipefail`
// per block; a block the reader runs in a terminal of its own (a server)
// runs in the background (Start) until stopped.
package walkthrough

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nodeproof/nodeproof/internal/doctest"
	"github.com/nodeproof/nodeproof/internal/freeport"
)

// Guide is the operator's guide, relative to the module root.
const Guide = "docs/operations.md"

// Linked are the repository's directories the guide's commands read, linked
// into the work directory.
var Linked = []string{"deploy", "firmware-testdata"}

// Env is a work directory prepared to run the guide's blocks.
type Env struct {
	// Root is the module root (where the guide and Linked are).
	Root string
	// Dir is the work directory the blocks run in.
	Dir string
	// Vars is the blocks' environment: PATH (the binaries first), HOME
	// (Dir), and what the caller adds (KUBECONFIG).
	Vars []string
	// Out receives every command and its output.
	Out io.Writer
	// Subst is replaced in every block before it runs (the guide's ports
	// by free ones), longest first.
	Subst map[string]string

	mu    sync.Mutex
	procs []*Proc
}

// New prepares dir (made if missing) to run the guide of the module at
// root: Linked linked in, binDir first on PATH.
func New(root, dir, binDir string, out io.Writer) (*Env, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for _, l := range Linked {
		if err := os.Symlink(filepath.Join(root, l), filepath.Join(dir, l)); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
	}
	return &Env{Root: root, Dir: dir, Out: out, Subst: map[string]string{}, Vars: []string{
		"PATH=" + binDir + string(os.PathListSeparator) + os.Getenv("PATH"),
		"HOME=" + dir, "LANG=C.UTF-8",
	}}, nil
}

// BuildBinaries builds nodeproof and nodeproof-agent of the module at root
// into binDir, with kubectl-nodeproof linked to nodeproof (what `make
// build` writes into bin/).
func BuildBinaries(ctx context.Context, root, binDir string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", binDir+string(os.PathSeparator), "./cmd/nodeproof", "./cmd/nodeproof-agent")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	plugin := filepath.Join(binDir, "kubectl-nodeproof")
	os.Remove(plugin)
	return os.Symlink("nodeproof", plugin)
}

// Block returns the guide's block name, with Subst applied.
func (e *Env) Block(name string) (string, error) {
	b, err := doctest.Named(filepath.Join(e.Root, Guide), name)
	if err != nil {
		return "", err
	}
	if b.Lang != "sh" {
		return "", fmt.Errorf("%s example:%s is %q, not a sh block", Guide, name, b.Lang)
	}
	return e.Expand(b.Text), nil
}

// Expand applies Subst to text (longest keys first).
func (e *Env) Expand(text string) string {
	keys := make([]string, 0, len(e.Subst))
	for k := range e.Subst {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return len(keys[i]) > len(keys[j]) })
	args := make([]string, 0, 2*len(keys))
	for _, k := range keys {
		args = append(args, k, e.Subst[k])
	}
	return strings.NewReplacer(args...).Replace(text)
}

// Run runs the guide's block name in bash (-e -u -o pipefail), printing
// each command before it runs ("$ ..."), and its output, to Out; it returns
// the output, and an error naming the block if a command failed.
func (e *Env) Run(ctx context.Context, name string) (string, error) {
	text, err := e.Block(name)
	if err != nil {
		return "", err
	}
	out, err := e.Script(ctx, text)
	if err != nil {
		return out, fmt.Errorf("%s example:%s: %w", Guide, name, err)
	}
	return out, nil
}

// Script runs text as Run runs a block (Subst is not applied: Expand):
// for what a caller adds to the guide (the demo's machine-side steps),
// printed the same way.
func (e *Env) Script(ctx context.Context, text string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -euo pipefail\nPS4='$ '\nset -x\n"+text)
	cmd.Dir, cmd.Env = e.Dir, e.Vars
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var buf strings.Builder
	w := io.MultiWriter(&buf, e.Out)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		return "", err
	}
	e.started(cmd.Process.Pid)
	err := cmd.Wait()
	return buf.String(), err
}

// pgids lists, one a line, the process groups the Env started (Guard
// kills them).
const pgids = ".walkthrough-pgids"

func (e *Env) started(pgid int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f, err := os.OpenFile(filepath.Join(e.Dir, pgids), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
		fmt.Fprintln(f, pgid)
		f.Close()
	}
}

// guardScript waits; on SIGTERM (its parent-death signal) it kills every
// process group in $1/.walkthrough-pgids and stops every swtpm daemon whose
// pid file is under $1.
const guardScript = `cleanup() {
  [ -f "$1/` + pgids + `" ] && while read -r g; do kill -s KILL -- "-$g" 2>/dev/null; done < "$1/` + pgids + `"
  find "$1" -name swtpm.pid | while read -r f; do kill "$(cat "$f")" 2>/dev/null; done
  exit 0
}
trap 'cleanup "$1"' TERM
while :; do sleep 1; done`

// Guard makes what the Env starts die with the calling process, however it
// dies (SIGKILL included, which it cannot handle): a small process that
// the kernel signals when the caller dies (a parent-death signal) kills the
// blocks' process groups and stops the software TPM daemons under Dir,
// which, being daemons, no parent-death signal of their own reaches. Call
// the returned func to end the guard when the caller cleans up itself.
func (e *Env) Guard() (stop func(), err error) {
	cmd := exec.Command("sh", "-c", guardScript, "walkthrough-guard", e.Dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return func() { cmd.Process.Kill(); cmd.Wait() }, nil
}

// Proc is a block running in the background.
type Proc struct {
	Name string
	Log  string // its output, a file in Dir
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start runs the guide's block name (one command: a server) in the
// background, as its reader runs it in a terminal of its own, its output to
// a log file, and waits until ready says it serves (nil: not at all). It
// prints the command with " &".
func (e *Env) Start(ctx context.Context, name string, ready func(context.Context) error) (*Proc, error) {
	text, err := e.Block(name)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(e.Out, "$ %s &\n", strings.TrimSpace(strings.ReplaceAll(text, "\\\n", "")))
	p := &Proc{Name: name, Log: filepath.Join(e.Dir, name+".log"), done: make(chan struct{})}
	logf, err := os.Create(p.Log)
	if err != nil {
		return nil, err
	}
	p.cmd = exec.Command("bash", "-c", "set -euo pipefail\nexec "+strings.TrimSpace(text))
	p.cmd.Dir, p.cmd.Env = e.Dir, e.Vars
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	e.started(p.cmd.Process.Pid)
	go func() {
		p.err = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	if ready == nil {
		return p, nil
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s example:%s exited (%v):\n%s", Guide, name, p.err, p.Output())
		default:
		}
		if err := ready(rctx); err == nil {
			return p, nil
		} else if rctx.Err() != nil {
			p.Stop()
			return nil, fmt.Errorf("%s example:%s did not become ready: %v\n%s", Guide, name, err, p.Output())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Output is what the process wrote so far.
func (p *Proc) Output() string {
	b, _ := os.ReadFile(p.Log)
	return string(b)
}

// Stop ends the process (SIGTERM, then SIGKILL after 10 s), as Ctrl-C in
// its terminal would, and waits for it.
func (p *Proc) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// Close stops every background block still running.
func (e *Env) Close() {
	e.mu.Lock()
	procs := e.procs
	e.procs = nil
	e.mu.Unlock()
	for _, p := range procs {
		p.Stop()
	}
}

// HTTPReady is a ready function: url answers 200.
func HTTPReady(url string) func(context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	}
}

// FreePorts returns n ports free now on every address, each with the next
// one free too (swtpm uses two), below the kernel's range of ephemeral
// ports (freeport.Pairs), so no outgoing connection of a test running
// beside this one takes them between now and the command's bind.
func FreePorts(n int) ([]int, error) { return freeport.Pairs(n) }
