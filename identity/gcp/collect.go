package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"cloud.google.com/go/compute/metadata"
)

// identityPath is the metadata path that mints instance identity tokens.
const identityPath = "instance/service-accounts/default/identity"

// Collect is the node side: it asks the metadata server for an identity
// token for audience, in full format (with google.compute_engine claims),
// and returns it as Evidence.
//
// The request goes through the metadata library, which sends
// Metadata-Flavor: Google, honours GCE_METADATA_HOST and retries transient
// failures; bound its time with ctx. c nil means the library's default
// client. The audience must be the one the server's Challenge named: an
// https URL of at most MaxAudienceSize bytes. A token larger than
// MaxTokenSize, or one that is not three dot-separated segments, is
// refused here rather than sent (the library reads the body whole; the
// metadata server is the node's own hypervisor).
func Collect(ctx context.Context, c *metadata.Client, audience string) (*Evidence, error) {
	if audience == "" || len(audience) > MaxAudienceSize || !strings.HasPrefix(audience, "https://") {
		return nil, fmt.Errorf("gcp: audience must be an https URL of at most %d bytes", MaxAudienceSize)
	}
	for i := 0; i < len(audience); i++ {
		if audience[i] <= ' ' || audience[i] >= 0x7f {
			return nil, errors.New("gcp: audience holds a space or a non-printable byte")
		}
	}
	if c == nil {
		c = metadata.NewClient(nil)
	}
	q := url.Values{"audience": {audience}, "format": {"full"}}
	tok, err := c.GetWithContext(ctx, identityPath+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("gcp: identity token from the metadata server: %w", err)
	}
	tok = strings.TrimSpace(tok)
	if len(tok) > MaxTokenSize {
		return nil, fmt.Errorf("gcp: identity token of %d bytes exceeds %d", len(tok), MaxTokenSize)
	}
	if strings.Count(tok, ".") != 2 {
		return nil, errors.New("gcp: the metadata server's answer is not a compact JWS")
	}
	return &Evidence{Token: tok}, nil
}
