package mcs_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// rawExchange writes raw to a fresh connection to addr and reads every
// response until the server closes the connection or goes quiet.
func rawExchange(t *testing.T, addr, raw string) (statuses []int, bodies []string, closed bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	br := bufio.NewReader(c)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			ne, ok := err.(net.Error)
			return statuses, bodies, !ok || !ne.Timeout()
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		statuses, bodies = append(statuses, resp.StatusCode), append(bodies, string(b))
	}
}

// TestSmugglingAttacks: requests that a proxy in front and this server could
// frame differently are refused with one answer, and the connection is
// closed, so nothing after them is read as a request.
func TestSmugglingAttacks(t *testing.T) {
	e := newEnv(t)
	addr := strings.TrimPrefix(e.plain.URL, "http://")
	smuggled := "GET /config/legacy HTTP/1.1\r\nHost: x\r\n\r\n" // the full config, were it read as a request
	cases := []struct {
		name string
		raw  string
		// want is the one status answered.
		want int
	}{
		{"Content-Length and Transfer-Encoding", "POST " + api.PathChallenge + " HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, 400},
		{"chunked alone", "POST " + api.PathChallenge + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, 400},
		{"two Content-Lengths", "POST " + api.PathChallenge + " HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 60\r\n\r\nabcd" + smuggled, 400},
		{"a Transfer-Encoding Go does not know", "POST " + api.PathChallenge + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n" + smuggled, 501},
		{"space before the colon", "POST " + api.PathChallenge + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n" + smuggled, 400},
		{"obs-fold", "POST " + api.PathChallenge + " HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n Transfer-Encoding: chunked\r\n\r\nabcd" + smuggled, 400},
		{"two Hosts", "GET /config/worker HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n" + smuggled, 400},
		{"oversized headers", "GET /config/worker HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("a", 2<<20) + "\r\n\r\n" + smuggled, 431},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			statuses, bodies, closed := rawExchange(t, addr, tc.raw)
			got := fmt.Sprintf("answers %v, closed=%v", statuses, closed)
			if len(bodies) > 1 || len(bodies) == 1 && strings.Contains(bodies[0], "pull-secret") {
				got += ", the smuggled request answered"
			}
			attacktable.Check(t, "MCS HTTP", "request smuggling: "+tc.name+", a request for the full config behind it",
				fmt.Sprintf("answers [%d], closed=true", tc.want), got)
		})
	}
	if strings.Contains(e.log.String(), `"path":"/config/legacy"`) {
		t.Fatalf("a smuggled request reached the handler:\n%s", e.log.String())
	}
	if !strings.Contains(e.log.String(), `"reason":"`+string(attest.ReasonMalformedRequest)+`"`) {
		t.Fatal("the refusal of a Transfer-Encoding was not logged with its reason")
	}
}
