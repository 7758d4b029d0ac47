package gcp

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

// FuzzVerifyClaims fuzzes what Verify reads after the signature passed
// (checks 6 to 10), without signing each input: the same function Verify
// calls, fed the payload directly. FuzzVerifyToken covers what comes
// before.
func FuzzVerifyClaims(f *testing.F) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	v, err := NewVerifier(Options{Keys: StaticKeys{}, AudiencePrefix: "https://api-int.example.com:22623", Clock: func() time.Time { return now }})
	if err != nil {
		f.Fatal(err)
	}
	kh := sha256.Sum256([]byte("fuzz kubelet key"))
	sess := &attest.Session{Kind: attest.KindGCP, Nonce: bytes.Repeat([]byte{7}, 32), KubeletKeySHA256: kh[:], IssuedAt: now, Expires: now.Add(time.Minute)}
	aud := v.audienceFor(sess.Nonce, sess.KubeletKeySHA256)
	valid := map[string]any{
		"iss": Issuer, "aud": aud, "iat": now.Unix(), "exp": now.Unix() + 3600, "email": "sa@example.iam.gserviceaccount.com",
		"google": map[string]any{"compute_engine": map[string]any{
			"project_id": "nodeproof-test", "project_number": 123456789012, "zone": "us-central1-a",
			"instance_id": "4567890123456789012", "instance_name": "worker-0", "instance_creation_timestamp": now.Unix() - 600,
			"license_id": []string{"1"},
		}},
	}
	b, _ := json.Marshal(valid)
	if _, err := v.claims(b, sess, now); err != nil {
		f.Fatalf("the valid seed is refused: %v", err)
	}
	f.Add(b)
	f.Add([]byte(`{"iss":"https://accounts.google.com","aud":["` + aud + `"],"exp":1e99,"iat":-1,"google":{"compute_engine":null}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		c, err := v.claims(payload, sess, now)
		if err != nil {
			if _, ok := attest.ReasonOf(err); !ok || c != nil {
				t.Fatalf("untyped error or claims with an error: %v", err)
			}
			return
		}
		if c.Kind != attest.KindGCP || c.GCP == nil || !bytes.Equal(c.KubeletKeySHA256, sess.KubeletKeySHA256) ||
			!isLabel(c.NodeName) || c.NodeName != c.GCP.InstanceName || !isLabel(c.GCP.Zone) || !isProjectID(c.GCP.ProjectID) ||
			c.Identity != "gcp:"+c.GCP.ProjectNumber+"/"+c.GCP.InstanceID || strings.Count(c.Identity, "/") != 1 {
			t.Fatalf("bad claims: %+v", c)
		}
	})
}
