package agent

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nodeproof/nodeproof/attest/tpm"
)

// Timing splits where an agent run's time went: the TPM's work (opening
// it, reading the EK, making the AK, activating the credential,
// quoting), the server's (what each answer's Server-Timing header says it
// spent), and the network's (each round trip, until its body was read,
// less the server's share). A boot's share of attestation is the sum;
// the console shows it (String) so an operator sees why a boot was slow.
type Timing struct {
	mu                   sync.Mutex
	tpm, network, server time.Duration
	requests             int
}

// AddTPM counts d as the TPM's.
func (t *Timing) AddTPM(d time.Duration) {
	t.mu.Lock()
	t.tpm += d
	t.mu.Unlock()
}

// Split returns the TPM's, the network's and the server's time, and the
// number of requests.
func (t *Timing) Split() (tpm, network, server time.Duration, requests int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tpm, t.network, t.server, t.requests
}

// String is the console's line: "TPM 0.81s, network 0.21s, server 0.05s
// (3 requests)".
func (t *Timing) String() string {
	tp, n, s, r := t.Split()
	return fmt.Sprintf("TPM %.2fs, network %.2fs, server %.2fs (%d requests)", tp.Seconds(), n.Seconds(), s.Seconds(), r)
}

// TPM wraps c so that its work is counted.
func (t *Timing) TPM(c TPM) TPM { return timedTPM{c: c, t: t} }

type timedTPM struct {
	c TPM
	t *Timing
}

func (x timedTPM) Request() (*tpm.ChallengeRequest, error) {
	start := time.Now()
	defer func() { x.t.AddTPM(time.Since(start)) }()
	return x.c.Request()
}

func (x timedTPM) Answer(ch *tpm.Challenge, kubeletKeySHA256 []byte) (*tpm.Evidence, error) {
	start := time.Now()
	defer func() { x.t.AddTPM(time.Since(start)) }()
	return x.c.Answer(ch, kubeletKeySHA256)
}

// Transport wraps rt so that each round trip is counted, split by the
// answer's Server-Timing.
func (t *Timing) Transport(rt http.RoundTripper) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	return timedTransport{rt: rt, t: t}
}

type timedTransport struct {
	rt http.RoundTripper
	t  *Timing
}

func (x timedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := x.rt.RoundTrip(r)
	if err != nil {
		x.t.done(time.Since(start), 0)
		return resp, err
	}
	resp.Body = &timedBody{ReadCloser: resp.Body, done: func() { x.t.done(time.Since(start), serverTiming(resp.Header)) }}
	return resp, nil
}

func (t *Timing) done(roundTrip, server time.Duration) {
	if server > roundTrip {
		server = roundTrip
	}
	t.mu.Lock()
	t.requests++
	t.server += server
	t.network += roundTrip - server
	t.mu.Unlock()
}

// timedBody calls done once: at EOF or Close, whichever comes first.
type timedBody struct {
	io.ReadCloser
	once sync.Once
	done func()
}

func (b *timedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(b.done)
	}
	return n, err
}

func (b *timedBody) Close() error {
	b.once.Do(b.done)
	return b.ReadCloser.Close()
}

// serverTiming reads the server's own time from a Server-Timing header
// ("app;dur=12.345", milliseconds; mcs.ServerTimingMetric); 0 when absent
// or unreadable (then the whole round trip counts as network).
func serverTiming(h http.Header) time.Duration {
	for _, v := range h.Values("Server-Timing") {
		for _, metric := range strings.Split(v, ",") {
			parts := strings.Split(strings.TrimSpace(metric), ";")
			if parts[0] != "app" {
				continue
			}
			for _, p := range parts[1:] {
				if d, ok := strings.CutPrefix(strings.TrimSpace(p), "dur="); ok {
					ms, err := strconv.ParseFloat(d, 64)
					if err != nil || ms < 0 || ms > 3600e3 {
						return 0
					}
					return time.Duration(ms * float64(time.Millisecond))
				}
			}
		}
	}
	return 0
}
