package anchors_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/anchors"
	"github.com/nodeproof/nodeproof/identity/aws"
)

// gather registers anchors on a fresh registry and returns the gauge's
// values by "kind role subject serial".
func gather(t *testing.T, as []anchors.Anchor) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := anchors.Register(reg, as); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != anchors.MetricName {
			t.Errorf("unexpected family %s", f.GetName())
			continue
		}
		for _, m := range f.Metric {
			l := map[string]string{}
			for _, p := range m.Label {
				l[p.GetName()] = p.GetValue()
			}
			out[l["kind"]+" "+l["role"]+" "+l["subject"]+" "+l["serial"]] = m.GetGauge().GetValue()
		}
	}
	return out
}

func key(a anchors.Anchor) string {
	return fmt.Sprintf("%s %s %s %x", a.Kind, a.Role, a.Cert.Subject, a.Cert.SerialNumber)
}

// TestShipped: the anchors a release ships, each exported with its own
// notAfter, and the dates the certificates' READMEs give.
func TestShipped(t *testing.T) {
	regions, err := aws.DefaultRegionCerts()
	if err != nil {
		t.Fatal(err)
	}
	as, err := anchors.Cloud(regions)
	if err != nil {
		t.Fatal(err)
	}
	got := gather(t, as)
	if len(got) != len(as) {
		t.Errorf("%d series for %d anchors: two anchors share their labels", len(got), len(as))
	}
	count := map[string]int{}
	for _, a := range as {
		if v, ok := got[key(a)]; !ok || v != float64(a.Cert.NotAfter.Unix()) {
			t.Errorf("%s: exported %v (%v), want notAfter %d", key(a), v, ok, a.Cert.NotAfter.Unix())
		}
		role := a.Role
		if a.Kind == attest.KindAWS {
			role = "region"
		}
		count[string(a.Kind)+" "+role]++
	}
	for _, c := range []struct {
		name string
		want int
	}{
		{"gce-vtpm root", 2},
		{"gce-vtpm intermediate", 3},
		{"aws-nitrotpm root", 1},
		{"azure-vtpm root", 1},
		{"azure-vtpm intermediate", 1},
		{"azure-vtpm document-root", 3},
		{"azure-vtpm document-intermediate", 6},
		{"aws region", len(regions.Regions())},
	} {
		if count[c.name] != c.want {
			t.Errorf("%s: %d anchors, want %d", c.name, count[c.name], c.want)
		}
	}
	// The dates identity/*/certs/README.md give.
	for _, c := range []struct {
		name string
		kind attest.Kind
		cn   string
		want string
	}{
		{"Nitro root G1", attest.KindNitroTPM, "aws.nitro-enclaves", "2049-10-28T14:28:05Z"},
		{"CAS EK/AK CA Root", attest.KindGCEVTPM, "EK/AK CA Root", "2122-07-08T05:57:23Z"},
		{"Azure vTPM root 2023", attest.KindAzureVTPM, "Azure Virtual TPM Root Certificate Authority 2023", "2048-06-01T18:15:41Z"},
	} {
		found := false
		for _, a := range as {
			if a.Kind == c.kind && a.Role == anchors.RoleRoot && a.Cert.Subject.CommonName == c.cn {
				found = true
				if got := a.Cert.NotAfter.UTC().Format(time.RFC3339); got != c.want {
					t.Errorf("%s: notAfter %s, want %s", c.name, got, c.want)
				}
			}
		}
		if !found {
			t.Errorf("%s: not among the anchors", c.name)
		}
	}
}

// TestOperatorRegionCerts: the Region certificates an operator gives
// (--aws-certs-dir) are exported, one series each, a rotation's two
// certificates of one Region included, and one that has expired still is:
// the gauge is what says so.
func TestOperatorRegionCerts(t *testing.T) {
	now := time.Now()
	cert := func(serial int64, notAfter time.Time) *x509.Certificate {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{Organization: []string{"Amazon Web Services LLC"}},
			NotBefore: now.Add(-48 * time.Hour), NotAfter: notAfter}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	expired, old, next := cert(1, now.Add(-time.Hour)), cert(2, now.Add(20*24*time.Hour)), cert(3, now.AddDate(10, 0, 0))
	as, err := anchors.Cloud(aws.NewRegionCerts(map[string][]*x509.Certificate{
		"eu-west-1": {expired},
		"us-east-1": {old, next},
	}))
	if err != nil {
		t.Fatal(err)
	}
	got := gather(t, as)
	for _, c := range []struct {
		name, region string
		cert         *x509.Certificate
	}{
		{"expired", "eu-west-1", expired},
		{"rotation, old", "us-east-1", old},
		{"rotation, next", "us-east-1", next},
	} {
		k := key(anchors.Anchor{Kind: attest.KindAWS, Role: c.region, Cert: c.cert})
		if got[k] != float64(c.cert.NotAfter.Unix()) {
			t.Errorf("%s: %s = %v, want %d", c.name, k, got[k], c.cert.NotAfter.Unix())
		}
	}
	if n := len(got); n != 2+3+1+1+1+3+6+3 {
		t.Errorf("%d series, want the 6 shipped GCE and Nitro anchors, the 11 Azure ones and 3 Region certificates", n)
	}
}
