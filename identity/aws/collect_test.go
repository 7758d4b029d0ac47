package aws_test

import (
	"errors"
	"io"
	"net/http"
	"testing"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"

	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
)

// TestCollectIsIMDSv2Only: when the metadata service refuses the IMDSv2
// token PUT (403, 404) and would serve the document to a tokenless IMDSv1
// GET, Collect fails and sends no tokenless GET. The node's own client
// (NewIMDSClient) stops at the refused token itself (so not with
// ErrIMDSv1); a client left at the SDK's default, which falls back to
// IMDSv1, is stopped by Collect with ErrIMDSv1. The control case shows
// that such a client does read the document over IMDSv1 from this fake.
func TestCollectIsIMDSv2Only(t *testing.T) {
	f := newFixture(t)
	files, err := f.useast1.Files(doc())
	if err != nil {
		t.Fatal(err)
	}
	clients := []struct {
		name    string
		client  func(url string) *imds.Client
		byGuard bool // stopped by Collect's check (ErrIMDSv1), not by the client
	}{
		{"NewIMDSClient", aws.NewIMDSClient, false},
		{"SDK default client (IMDSv1 fallback on)", func(url string) *imds.Client {
			return imds.New(imds.Options{Endpoint: url})
		}, true},
		{"fallback explicitly on", func(url string) *imds.Client {
			return imds.New(imds.Options{Endpoint: url, EnableFallback: awssdk.TrueTernary})
		}, true},
	}
	for _, status := range []struct {
		name string
		code int
	}{
		{"token PUT 403", http.StatusForbidden},
		{"token PUT 404", http.StatusNotFound},
	} {
		for _, c := range clients {
			t.Run(status.name+"/"+c.name, func(t *testing.T) {
				md := awstest.NewIMDS(files)
				defer md.Close()
				md.RefuseTokens(status.code)
				ev, err := aws.Collect(ctx, c.client(md.URL))
				if err == nil {
					t.Fatalf("Collect succeeded without an IMDSv2 token: %+v", ev)
				}
				if errors.Is(err, aws.ErrIMDSv1) != c.byGuard {
					t.Fatalf("Collect: %v; want ErrIMDSv1: %v", err, c.byGuard)
				}
				if n := md.UnauthenticatedGets(); n != 0 {
					t.Fatalf("%d tokenless (IMDSv1) GETs reached the metadata service", n)
				}
				if md.Gets() != 0 {
					t.Fatalf("the metadata service answered %d GETs", md.Gets())
				}
			})
		}
		// Control: the fake does serve IMDSv1 to a client that falls back,
		// so the cases above would see the GETs if Collect let them out.
		t.Run(status.name+"/control: SDK default client reads over IMDSv1", func(t *testing.T) {
			md := awstest.NewIMDS(files)
			defer md.Close()
			md.RefuseTokens(status.code)
			out, err := imds.New(imds.Options{Endpoint: md.URL}).GetDynamicData(ctx, &imds.GetDynamicDataInput{Path: "instance-identity/document"})
			if err != nil {
				t.Fatalf("IMDSv1 fallback read: %v", err)
			}
			b, _ := io.ReadAll(out.Content)
			out.Content.Close()
			if string(b) != string(files.Document) || md.UnauthenticatedGets() != 1 {
				t.Fatalf("IMDSv1 read %q with %d tokenless GETs", b, md.UnauthenticatedGets())
			}
		})
	}
	// With tokens served again, the node's client collects over IMDSv2.
	md := awstest.NewIMDS(files)
	defer md.Close()
	if _, err := aws.Collect(ctx, aws.NewIMDSClient(md.URL)); err != nil {
		t.Fatalf("Collect over IMDSv2: %v", err)
	}
	if md.UnauthenticatedGets() != 0 || md.Gets() != 3 {
		t.Fatalf("IMDSv2 collection: %d tokenless GETs, %d answered (want 0, 3)", md.UnauthenticatedGets(), md.Gets())
	}
}
