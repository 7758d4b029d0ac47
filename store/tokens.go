package store

import "context"

// TokenIndex finds the records that name a bootstrap token: a per-node
// bootstrap token (Record.BootstrapTokenID) was issued for the one node
// its record names. The approver asks it which node a token may ask
// certificates for, before it spends any of that node's budget.
type TokenIndex interface {
	// RecordsForToken returns the records naming bootstrap token id,
	// expired ones included (callers decide). known is false when the
	// index cannot tell now (a watch not synced or failing): the caller
	// then treats the token as one it knows nothing of. It never reads
	// the API server, so a flood of CSRs cannot turn into a flood of
	// reads.
	RecordsForToken(ctx context.Context, id string) (recs []*Record, known bool, err error)
}
