package store

import (
	"crypto/sha256"
	"fmt"
	"testing"
	"time"
)

func cert(i int, recorded, notAfter time.Time) IssuedCertificate {
	sum := sha256.Sum256(fmt.Appendf(nil, "certificate %d", i))
	return IssuedCertificate{SHA256: sum[:], CSR: fmt.Sprint("csr-", i), RecordedAt: recorded, NotAfter: notAfter}
}

// TestLineageAdd: newest first, expired certificates dropped, at most
// MaxLineageCertificates, none twice.
func TestLineageAdd(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := &Lineage{NodeName: "n"}
	for i := range MaxLineageCertificates + 4 {
		if !l.Add(cert(i, t0.Add(time.Duration(i)*time.Minute), t0.Add(time.Hour)), t0) {
			t.Fatalf("certificate %d not added", i)
		}
	}
	if len(l.Certificates) != MaxLineageCertificates {
		t.Fatalf("%d certificates kept, want %d", len(l.Certificates), MaxLineageCertificates)
	}
	newest := MaxLineageCertificates + 3
	if _, ok := l.Has(cert(newest, t0, t0).SHA256); !ok || l.Certificates[0].CSR != fmt.Sprint("csr-", newest) {
		t.Fatalf("the newest is not first: %s", l.Certificates[0].CSR)
	}
	for i := range 4 {
		if _, ok := l.Has(cert(i, t0, t0).SHA256); ok {
			t.Errorf("certificate %d, among the oldest beyond the bound, is kept", i)
		}
	}
	if l.Add(cert(newest, t0.Add(time.Hour), t0.Add(time.Hour)), t0) {
		t.Error("a certificate already in the lineage was added again")
	}
	// Later, every certificate has expired but the one added now.
	l.Add(cert(100, t0.Add(2*time.Hour), t0.Add(3*time.Hour)), t0.Add(2*time.Hour))
	if len(l.Certificates) != 1 {
		t.Fatalf("%d certificates after the others expired, want 1", len(l.Certificates))
	}
	if _, ok := l.Has(nil); ok {
		t.Error("an empty sum matched")
	}
}

// TestLineageOf: a lineage belongs to one enrolment: identity, binding
// time and kubelet key.
func TestLineageOf(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := sha256.Sum256([]byte("k"))
	other := sha256.Sum256([]byte("other"))
	l := &Lineage{NodeName: "n", Identity: "ek:a", BoundAt: t0, KubeletKeySHA256: key[:]}
	b := func(f func(*Binding)) *Binding {
		b := &Binding{NodeName: "n", Identity: "ek:a", CreatedAt: t0, KubeletKeySHA256: key[:]}
		f(b)
		return b
	}
	for _, tc := range []struct {
		name string
		b    *Binding
		want bool
	}{
		{"the same enrolment", b(func(*Binding) {}), true},
		{"enrolled again, same key (EnrolledAt moves)", b(func(b *Binding) { b.EnrolledAt = t0.Add(time.Hour) }), true},
		{"another identity", b(func(b *Binding) { b.Identity = "ek:b" }), false},
		{"released and bound again", b(func(b *Binding) { b.CreatedAt = t0.Add(time.Hour) }), false},
		{"enrolled again with a new kubelet key", b(func(b *Binding) { b.KubeletKeySHA256 = other[:] }), false},
		{"another name", b(func(b *Binding) { b.NodeName = "m" }), false},
		{"no binding", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := l.Of(tc.b); got != tc.want {
				t.Fatalf("Of = %v, want %v", got, tc.want)
			}
		})
	}
	var none *Lineage
	if none.Of(b(func(*Binding) {})) {
		t.Error("a nil lineage belongs to a binding")
	}
}
