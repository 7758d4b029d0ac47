package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/bench/fleet"
	"github.com/nodeproof/nodeproof/bench/internal/proc"
)

// etcdKinds are the etcd key prefixes of the objects a node keeps, what
// they are, and what removes them. Custom resources are stored as JSON,
// built-in kinds as protobuf.
var etcdKinds = []struct{ name, prefix, removed string }{
	{"NodeBinding", "/registry/nodeproof.io/nodebindings/", "`nodeproof release` only"},
	{"AttestationMarker", "/registry/nodeproof.io/attestationmarkers/", "the identity's: on release; others at expiry (server GC)"},
	{"NodeAttestation (record)", "/registry/nodeproof.io/nodeattestations/", "at expiry, 1 h (server GC, every 10 min)"},
	{"KubeletLineage", "/registry/nodeproof.io/kubeletlineages/", "never"},
	{"NodeNameHistory", "/registry/nodeproof.io/nodenamehistories/", "never"},
	{"IdentityBan", "/registry/nodeproof.io/identitybans/", "`nodeproof unban`"},
	{"bootstrap token Secret", "/registry/secrets/kube-system/bootstrap-token-", "at the record's expiry (server GC)"},
	{"Event", "/registry/events/", "etcd lease, the API server's --event-ttl (1 h)"},
	{"CertificateSigningRequest", "/registry/certificatesigningrequests/", "kube-controller-manager's csrcleaner, 1 h after issue (none here)"},
	{"Node (no kubelets here)", "/registry/minions/", "the node's deletion"},
}

// footprint is what etcd holds: per kind, the keys and the bytes of
// their values (what the API server stored), and the database's size.
type footprint struct {
	kinds               []kindFootprint
	keys                int   // every key under /registry/
	dbSize, dbSizeInUse int64 // etcd's maintenance status
}

type kindFootprint struct {
	name, removed string
	count         int
	bytes         int64
}

// etcdURL is the control plane's etcd client URL, from its command line.
func etcdURL(w *fleet.World) (string, error) {
	pid := proc.Find("etcd", w.CPDir)
	if pid == 0 {
		return "", fmt.Errorf("etcd's process not found")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return "", err
	}
	for _, a := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(a, "--listen-client-urls="); ok {
			return strings.Split(v, ",")[0], nil
		}
	}
	return "", fmt.Errorf("etcd's command line names no --listen-client-urls")
}

// etcdCall is a POST to etcd's JSON gateway (the v3 API over HTTP).
func etcdCall(ctx context.Context, url, path string, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	r.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(r)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 256<<20))
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %.300s", path, res.Status, b)
	}
	return json.Unmarshal(b, resp)
}

// prefixEnd is the end of the key range of a prefix.
func prefixEnd(p string) string {
	b := []byte(p)
	b[len(b)-1]++
	return string(b)
}

// rangeBytes counts the keys under prefix and sums their values' bytes,
// a page at a time.
func rangeBytes(ctx context.Context, url, prefix string) (int, int64, error) {
	type kv struct {
		Key   []byte `json:"key"`
		Value []byte `json:"value"`
	}
	var (
		n   int
		sum int64
	)
	from, end := prefix, prefixEnd(prefix)
	for {
		var resp struct {
			KVs  []kv `json:"kvs"`
			More bool `json:"more"`
		}
		req := map[string]any{"key": base64.StdEncoding.EncodeToString([]byte(from)),
			"range_end": base64.StdEncoding.EncodeToString([]byte(end)), "limit": 500}
		if err := etcdCall(ctx, url, "/v3/kv/range", req, &resp); err != nil {
			return 0, 0, err
		}
		for _, e := range resp.KVs {
			n++
			sum += int64(len(e.Value))
		}
		if !resp.More || len(resp.KVs) == 0 {
			return n, sum, nil
		}
		from = string(resp.KVs[len(resp.KVs)-1].Key) + "\x00"
	}
}

// bindingBytes is the bytes of every NodeBinding in etcd.
func bindingBytes(ctx context.Context, w *fleet.World) (int64, error) {
	url, err := etcdURL(w)
	if err != nil {
		return 0, err
	}
	_, b, err := rangeBytes(ctx, url, etcdKinds[0].prefix)
	return b, err
}

// measureFootprint reads etcd: each kind's keys and bytes, every key
// under /registry/, and the database's size (total and in use: the API
// server compacts old revisions every 5 minutes; the file is not shrunk
// without a defragmentation).
func measureFootprint(ctx context.Context, w *fleet.World) (footprint, error) {
	var f footprint
	url, err := etcdURL(w)
	if err != nil {
		return f, err
	}
	for _, k := range etcdKinds {
		n, b, err := rangeBytes(ctx, url, k.prefix)
		if err != nil {
			return f, err
		}
		f.kinds = append(f.kinds, kindFootprint{name: k.name, removed: k.removed, count: n, bytes: b})
	}
	var cnt struct {
		Count string `json:"count"`
	}
	if err := etcdCall(ctx, url, "/v3/kv/range", map[string]any{"key": base64.StdEncoding.EncodeToString([]byte("/registry/")),
		"range_end": base64.StdEncoding.EncodeToString([]byte(prefixEnd("/registry/"))), "count_only": true}, &cnt); err != nil {
		return f, err
	}
	f.keys, _ = strconv.Atoi(cnt.Count)
	var st struct {
		DBSize      string `json:"dbSize"`
		DBSizeInUse string `json:"dbSizeInUse"`
	}
	if err := etcdCall(ctx, url, "/v3/maintenance/status", map[string]any{}, &st); err != nil {
		return f, err
	}
	f.dbSize, _ = strconv.ParseInt(st.DBSize, 10, 64)
	f.dbSizeInUse, _ = strconv.ParseInt(st.DBSizeInUse, 10, 64)
	return f, nil
}

// footprintReport is the kinds' table at enrolment and after the day, per
// node (n nodes).
func footprintReport(n int, at, after footprint, afterWhat string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nBytes per node in etcd (values as the API server stored them: custom resources as JSON, built-in kinds as protobuf; %d nodes):\n\n", n)
	fmt.Fprintf(&b, "| object | removed by | at enrolment: objects / bytes | per node | after %s: objects / bytes | per node |\n|---|---|---|---|---|---|\n", afterWhat)
	var sum0, sum1 int64
	for i, k := range at.kinds {
		a := after.kinds[i]
		sum0 += k.bytes
		sum1 += a.bytes
		fmt.Fprintf(&b, "| %s | %s | %d / %s | %s | %d / %s | %s |\n", k.name, k.removed, k.count, kb(k.bytes), perNode(k.bytes, n), a.count, kb(a.bytes), perNode(a.bytes, n))
	}
	fmt.Fprintf(&b, "| all of the above | | %s | %s | %s | %s |\n", kb(sum0), perNode(sum0, n), kb(sum1), perNode(sum1, n))
	fmt.Fprintf(&b, "| etcd: keys under /registry/ (all kinds: the cluster's own too) | | %d | | %d | |\n", at.keys, after.keys)
	fmt.Fprintf(&b, "| etcd: database size / in use | | %s / %s | | %s / %s | |\n", mb(at.dbSize), mb(at.dbSizeInUse), mb(after.dbSize), mb(after.dbSizeInUse))
	return b.String()
}

func kb(n int64) string { return fmt.Sprintf("%.1f KB", float64(n)/1024) }
func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/(1<<20)) }
func perNode(n int64, nodes int) string {
	if nodes == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f B", float64(n)/float64(nodes))
}

// memory is a process's resident set and Go heap.
type memory struct {
	rss, heap int64
}

// memoryOf reads the server's (live heap after a forced collection, from
// its pprof heap profile) and the approver's (heap allocated, from its
// metrics: it serves no profiles) RSS and heap.
func memoryOf(ctx context.Context, w *fleet.World, debugAddr, approverMetrics string) (server, approver memory, err error) {
	server.rss, approver.rss = proc.RSS(w.Server.PID()), proc.RSS(w.Approver.PID())
	if server.heap, err = liveHeap(ctx, debugAddr); err != nil {
		return server, approver, err
	}
	approver.heap, err = scrape(ctx, "http://"+approverMetrics+"/metrics", `(?m)^go_memstats_heap_alloc_bytes ([0-9.e+]+)$`)
	return server, approver, err
}

// liveHeap is the server's live heap: HeapAlloc after a forced
// collection, from its pprof heap profile.
func liveHeap(ctx context.Context, debugAddr string) (int64, error) {
	return scrape(ctx, "http://"+debugAddr+"/debug/pprof/heap?gc=1&debug=1", `(?m)^# HeapAlloc = (\d+)$`)
}

// heapTop is the top of the server's heap profile (in-use bytes), what
// holds its live heap.
func heapTop(debugAddr, bin string) string {
	file := filepath.Join(os.TempDir(), "nodeproof-scale-heap.pprof")
	if err := fetchProfile("http://"+debugAddr+"/debug/pprof/heap?gc=1", file); err != nil {
		return "server heap profile: " + err.Error() + "\n"
	}
	b, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=15", "-sample_index=inuse_space", bin, file).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("server heap profile: %v\n%s", err, b)
	}
	return fmt.Sprintf("\nnodeproof serve heap profile after the day, in use (%s):\n%s", file, b)
}

// compact compacts etcd's history up to its current revision (what the
// API server does every 5 minutes, to the revision of 5 minutes before),
// so the database's in-use size shows the live objects, and returns the
// revision.
func compact(ctx context.Context, w *fleet.World) (int64, error) {
	url, err := etcdURL(w)
	if err != nil {
		return 0, err
	}
	var st struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	if err := etcdCall(ctx, url, "/v3/maintenance/status", map[string]any{}, &st); err != nil {
		return 0, err
	}
	rev, err := strconv.ParseInt(st.Header.Revision, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("etcd status: revision %q: %w", st.Header.Revision, err)
	}
	var out map[string]any
	if err := etcdCall(ctx, url, "/v3/kv/compaction", map[string]any{"revision": rev, "physical": true}, &out); err != nil {
		return 0, err
	}
	return rev, nil
}

// scrape reads one number from a page.
func scrape(ctx context.Context, url, pattern string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	res, err := http.DefaultClient.Do(r)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return 0, err
	}
	m := regexp.MustCompile(pattern).FindSubmatch(b)
	if m == nil {
		return 0, fmt.Errorf("%s: no %s", url, pattern)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	return int64(v), err
}

// memoryReport is the processes' memory with no node, at enrolment and
// after the day, and the slope per 1,000 nodes.
func memoryReport(n int, labels []string, server, approver []memory) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nMemory (RSS from /proc; server heap: live after a forced collection; approver heap: allocated, from go_memstats_heap_alloc_bytes):\n\n| process | ")
	b.WriteString(strings.Join(labels, " | "))
	fmt.Fprintf(&b, " | per 1,000 nodes (last − first) / %d × 1,000 |\n|---|", n)
	b.WriteString(strings.Repeat("---|", len(labels)+1))
	b.WriteString("\n")
	row := func(name string, ms []memory, f func(memory) int64) {
		fmt.Fprintf(&b, "| %s |", name)
		for _, m := range ms {
			fmt.Fprintf(&b, " %s |", mb(f(m)))
		}
		d := f(ms[len(ms)-1]) - f(ms[0])
		fmt.Fprintf(&b, " %s |\n", mb(d*1000/int64(max(n, 1))))
	}
	rss := func(m memory) int64 { return m.rss }
	heap := func(m memory) int64 { return m.heap }
	row("nodeproof serve: RSS", server, rss)
	row("nodeproof serve: Go heap", server, heap)
	row("nodeproof approve: RSS", approver, rss)
	row("nodeproof approve: Go heap", approver, heap)
	return b.String()
}

// sortedKeys is m's keys, sorted.
func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
