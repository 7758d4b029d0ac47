package tpm

import (
	"bytes"
	"testing"
	"time"
)

// TestTicketHolds: an opened AK ticket stands for the credential
// activation only when it names this EK and this AK and is fresh; every
// other ticket is ignored (the node activates a credential).
func TestTicketHolds(t *testing.T) {
	now := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	ek := bytes.Repeat([]byte{1}, 32)
	otherEK := bytes.Repeat([]byte{2}, 32)
	const ak, otherAK = "000b" + "aa", "000b" + "bb"
	ttl := DefaultTicketTTL
	for _, tc := range []struct {
		name   string
		ticket []byte
		want   bool
	}{
		{name: "this EK, this AK, issued an hour ago", ticket: issueTicket(ek, ak, now.Add(-time.Hour)), want: true},
		{name: "issued just now", ticket: issueTicket(ek, ak, now), want: true},
		{name: "a replica's clock a minute ahead", ticket: issueTicket(ek, ak, now.Add(time.Minute)), want: true},
		{name: "another machine's EK", ticket: issueTicket(otherEK, ak, now)},
		{name: "another AK of this TPM (a new one, never activated)", ticket: issueTicket(ek, otherAK, now)},
		{name: "expired", ticket: issueTicket(ek, ak, now.Add(-ttl))},
		{name: "issued in the future", ticket: issueTicket(ek, ak, now.Add(time.Hour))},
		{name: "another format", ticket: []byte(`{"v":2,"ek":"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=","ak":"000baa","at":"2026-11-29T08:00:00Z"}`)},
		{name: "not JSON", ticket: []byte("ticket")},
		{name: "empty", ticket: nil},
		{name: "no EK", ticket: issueTicket(nil, ak, now)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ticketHolds(tc.ticket, ek, ak, now, ttl); got != tc.want {
				t.Errorf("ticketHolds = %v, want %v", got, tc.want)
			}
		})
	}
}
