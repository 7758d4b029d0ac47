package aws

import (
	"context"
	"errors"
	"fmt"
	"io"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// imdsTokenHeader carries the IMDSv2 session token on every metadata
// request.
const imdsTokenHeader = "X-aws-ec2-metadata-token"

// ErrIMDSv1 is returned (wrapped) when a metadata request would have gone
// out without an IMDSv2 session token: an IMDS client that fell back to
// IMDSv1 after its token PUT was refused or failed.
var ErrIMDSv1 = errors.New("aws: refusing an IMDSv1 request (no IMDSv2 session token)")

// NewIMDSClient returns the instance metadata client the node side uses:
// IMDSv2 only. Its EnableFallback is off, so a token PUT that is refused
// (403, 404, 405) or fails is an error, never a silent fall back to
// unauthenticated IMDSv1 GETs (the SDK's default). endpoint "" is the
// SDK's default: AWS_EC2_METADATA_SERVICE_ENDPOINT when set, else
// http://169.254.169.254.
func NewIMDSClient(endpoint string) *imds.Client {
	return imds.New(imds.Options{Endpoint: endpoint, EnableFallback: awssdk.FalseTernary})
}

// Collect is the node side: it reads the instance identity document, its
// rsa2048 PKCS#7 and its legacy signature from the instance metadata
// service and returns them unchanged as Evidence.
//
// It speaks IMDSv2 only, whatever c's options: c should come from
// NewIMDSClient, and every request Collect makes is checked, after the
// client's token handling, to carry an IMDSv2 session token; one that does
// not (a client left with the SDK's default IMDSv1 fallback, after a
// refused token PUT) is not sent and Collect fails with ErrIMDSv1. The
// document and rsa2048 are required; the legacy signature is read when
// IMDS serves it and left empty otherwise, since the verifier does not
// need it. Each body is read up to the verifier's size bound and refused
// beyond it.
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
	sig, err := dynamic(ctx, c, "instance-identity/signature", MaxSignatureSize)
	switch {
	case err == nil:
		ev.Signature = string(sig)
	case errors.Is(err, ErrIMDSv1):
		return nil, err
	}
	return ev, nil
}

// requireToken is the last finalize step of every metadata request
// Collect makes: a request without an IMDSv2 session token is not sent.
var requireToken = middleware.FinalizeMiddlewareFunc("nodeproofRequireIMDSv2Token",
	func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
		req, ok := in.Request.(*smithyhttp.Request)
		if !ok || req.Header.Get(imdsTokenHeader) == "" {
			return middleware.FinalizeOutput{}, middleware.Metadata{}, ErrIMDSv1
		}
		return next.HandleFinalize(ctx, in)
	})

// imdsv2Only adds requireToken to one operation's stack.
func imdsv2Only(o *imds.Options) {
	o.APIOptions = append(o.APIOptions, func(s *middleware.Stack) error {
		return s.Finalize.Add(requireToken, middleware.After)
	})
}

// dynamic reads /latest/dynamic/<path>, at most max bytes.
func dynamic(ctx context.Context, c *imds.Client, path string, max int) ([]byte, error) {
	out, err := c.GetDynamicData(ctx, &imds.GetDynamicDataInput{Path: path}, imdsv2Only)
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
