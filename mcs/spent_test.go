package mcs_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/store"
)

// bigConfigs serves a full config larger than the socket buffers between
// client and server, so that a client that stops reading makes the
// server's write fail.
type bigConfigs struct{ staticConfigs }

func (c *bigConfigs) Full(pool, accept string, node *store.Record) ([]byte, error) {
	if _, err := c.staticConfigs.Full(pool, accept, node); err != nil {
		return nil, err
	}
	return []byte(`{"secret":"` + strings.Repeat("s", 32<<20) + `"}`), nil
}

// TestPartialDeliveryAttacks: a config token is spent as the body starts
// to leave. A client that reads the start of the config (the start of the
// secrets), closes the connection and asks again with the same token is
// refused, whether or not the server's write failed; a HEAD leaves it
// usable.
func TestPartialDeliveryAttacks(t *testing.T) {
	e := newEnvWith(t, &bigConfigs{})
	m := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))
	ch, r := e.challenge(m, "worker", "worker-9")
	if ch == nil {
		t.Fatalf("challenge: %s", r.body)
	}
	vr, r := e.verify(e.verifyBody(m, ch))
	if vr == nil {
		t.Fatalf("verify: %s", r.body)
	}
	auth := map[string]string{"Authorization": "Bearer " + vr.ConfigToken}
	if r := e.do(http.MethodHead, e.secure.URL+"/config/worker", nil, auth); r.status != 200 {
		t.Fatalf("HEAD: %d %s", r.status, r.reason)
	}

	req, _ := http.NewRequest(http.MethodGet, e.secure.URL+"/config/worker", nil)
	req.Header.Set("Authorization", "Bearer "+vr.ConfigToken)
	client := &http.Client{Transport: e.secure.Client().Transport.(*http.Transport).Clone()}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	start := make([]byte, 64)
	if _, err := io.ReadFull(resp.Body, start); err != nil || !bytes.HasPrefix(start, []byte(`{"secret":"sss`)) {
		t.Fatalf("the start of the config: %q %v", start, err)
	}
	resp.Body.Close() // before the end: the connection is closed
	client.CloseIdleConnections()

	again := e.do(http.MethodGet, e.secure.URL+"/config/worker", nil, auth)
	attacktable.Check(t, "MCS tokens", "read the start of the full config, close the connection, fetch again with the same token",
		"403 "+string(attest.ReasonTokenUsed), fmt.Sprintf("%d %s", again.status, again.reason))
	if again.reason == "" {
		t.Fatalf("the second fetch was served (%d bytes)", len(again.body))
	}
}
