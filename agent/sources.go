package agent

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/gcevtpm"
	"github.com/nodeproof/nodeproof/identity/nitrotpm"
)

// SourceOptions say where a Source finds this machine's evidence.
type SourceOptions struct {
	// TPMPath is the TPM: DefaultTPMPath, or "tcp:HOST:PORT" (swtpm's
	// command port; EventLog is then the log sent).
	TPMPath  string
	EventLog string
	// IMDSEndpoint is the EC2 instance metadata service ("" : the
	// instance's own).
	IMDSEndpoint string
	// NSM is the Nitro Secure Module (nil: the NitroTPM's own vendor
	// command; a fake in tests).
	NSM nitrotpm.NSM
	// Timing, when set, counts the time spent in the TPM.
	Timing *Timing
	// EKKind is the kind of endorsement key a TPM attests with
	// (attest.EKKinds; "": attest.EKKindRSA2048): the one its pool accepts.
	EKKind string
}

// Source opens one kind of evidence on this machine; the closer releases
// what it opened (nil when nothing).
type Source func(ctx context.Context, o SourceOptions) (Evidence, io.Closer, error)

// Sources are the kinds of evidence the agent can present, by kind: the
// one place a new kind is added on the node side.
func Sources() map[attest.Kind]Source {
	return map[attest.Kind]Source{
		attest.KindTPM: func(_ context.Context, o SourceOptions) (Evidence, io.Closer, error) {
			opened := time.Now()
			ch, err := openChannel(o)
			if err != nil {
				return nil, nil, err
			}
			kind := o.EKKind
			if kind == "" {
				kind = attest.EKKindRSA2048
			}
			coll, err := tpm.NewCollectorEK(ch, kind)
			var c TPM = coll
			if o.Timing != nil {
				o.Timing.AddTPM(time.Since(opened)) // opening it, reading the EK, making the AK
				c = o.Timing.TPM(coll)
			}
			if err != nil {
				return nil, nil, err
			}
			return TPMEvidence{Collector: c}, coll, nil
		},
		attest.KindGCP: func(context.Context, SourceOptions) (Evidence, io.Closer, error) {
			return GCPEvidence{}, nil, nil
		},
		attest.KindAWS: func(_ context.Context, o SourceOptions) (Evidence, io.Closer, error) {
			return AWSEvidence{IMDS: aws.NewIMDSClient(o.IMDSEndpoint)}, nil, nil
		},
		attest.KindGCEVTPM: func(ctx context.Context, o SourceOptions) (Evidence, io.Closer, error) {
			ch, err := openChannel(o)
			if err != nil {
				return nil, nil, err
			}
			coll, err := gcevtpm.NewCollector(ctx, ch, gcevtpm.CollectorOptions{})
			if err != nil {
				return nil, nil, err
			}
			return GCEVTPMEvidence{Collector: coll}, coll, nil
		},
		attest.KindNitroTPM: func(_ context.Context, o SourceOptions) (Evidence, io.Closer, error) {
			ch, err := openChannel(o)
			if err != nil {
				return nil, nil, err
			}
			coll, err := nitrotpm.NewCollector(ch, o.NSM)
			if err != nil {
				return nil, nil, err
			}
			return NitroTPMEvidence{Collector: coll, IMDS: aws.NewIMDSClient(o.IMDSEndpoint)}, coll, nil
		},
	}
}

// openChannel opens o's TPM: nil for the system TPM (the collectors open
// it, with the system event log), a socket to swtpm for "tcp:HOST:PORT".
func openChannel(o SourceOptions) (tpm.Channel, error) {
	path := o.TPMPath
	if path == "" {
		path = DefaultTPMPath
	}
	addr, ok := strings.CutPrefix(path, "tcp:")
	if !ok {
		if path != DefaultTPMPath {
			return nil, fmt.Errorf("%s: only %s or tcp:HOST:PORT", path, DefaultTPMPath)
		}
		return nil, nil
	}
	var log []byte
	if o.EventLog != "" {
		var err error
		if log, err = os.ReadFile(o.EventLog); err != nil {
			return nil, err
		}
	}
	return tpm.DialSocket("tcp", addr, log)
}
