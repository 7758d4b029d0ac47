package aws

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
)

// Collect is the node side: it reads the instance identity document, its
// rsa2048 PKCS#7 and its legacy signature from the instance metadata
// service and returns them unchanged as Evidence.
//
// c should be made with imds.Options{EnableFallback: aws.FalseTernary} so
// that it speaks IMDSv2 only (a session token from PUT /latest/api/token on
// every request) and never falls back to IMDSv1. The document and rsa2048
// are required; the legacy signature is read when IMDS serves it and left
// empty otherwise, since the verifier does not need it. Each body is read
// up to the verifier's size bound and refused beyond it.
func Collect(ctx context.Context, c *imds.Client) (*Evidence, error) {
	if c == nil {
		return nil, errors.New("aws: Collect needs an IMDS client")
	}
	doc, err := dynamic(ctx, c, "instance-identity/document", MaxDocumentSize)
	if err != nil {
		return nil, err
	}
	p7, err := dynamic(ctx, c, "instance-identity/rsa2048", MaxPKCS7Size)
	if err != nil {
		return nil, err
	}
	ev := &Evidence{Document: doc, PKCS7: string(p7)}
	if sig, err := dynamic(ctx, c, "instance-identity/signature", MaxSignatureSize); err == nil {
		ev.Signature = string(sig)
	}
	return ev, nil
}

// dynamic reads /latest/dynamic/<path>, at most max bytes.
func dynamic(ctx context.Context, c *imds.Client, path string, max int) ([]byte, error) {
	out, err := c.GetDynamicData(ctx, &imds.GetDynamicDataInput{Path: path})
	if err != nil {
		return nil, fmt.Errorf("aws: IMDS %s: %w", path, err)
	}
	defer out.Content.Close()
	b, err := io.ReadAll(io.LimitReader(out.Content, int64(max)+1))
	if err != nil {
		return nil, fmt.Errorf("aws: IMDS %s: %w", path, err)
	}
	if len(b) > max {
		return nil, fmt.Errorf("aws: IMDS %s: more than %d bytes", path, max)
	}
	return b, nil
}
