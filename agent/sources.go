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
	"github.com/nodeproof/nodeproof/identity/azuretpm"
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
	// AzureIMDS is Azure's Instance Metadata Service, which signs the
	// attested document (nil: Azure's, at its address; a fake in tests).
	AzureIMDS *azuretpm.IMDS
	// Timing, when set, counts the time spent in the TPM.
	Timing *Timing
	// EKKind is the kind of endorsement key a TPM attests with
	// (attest.EKKinds; "": attest.EKKindRSA2048): the one its pool accepts.
	EKKind string
	// AKState is where a TPM's attestation key is kept between runs
	// (DefaultAKState; "" keeps none: a new AK each run).
	AKState string
	// Console, when set, is told what happened to a kept AK.
	Console io.Writer
}

// Source opens one kind of evidence on this machine; the closer releases
// what it opened (nil when nothing).
type Source func(ctx context.Context, o SourceOptions) (Evidence, io.Closer, error)

// A SourceRow is one kind of evidence the agent can present: the one
// place a new kind is added on the node side. The agent's usage lists the
// rows (Kind, Help and Auto), --evidence opens the row's Source, and
// --evidence auto tries the rows' detections in SourceTable's order.
type SourceRow struct {
	// Kind is the evidence's kind, the value of --evidence.
	Kind attest.Kind
	// Help says in one line what the evidence is and where it comes
	// from; Auto when --evidence auto finds it. Both for the usage.
	Help, Auto string
	// Open opens the evidence.
	Open Source
	// detect reports whether this machine has the evidence and where it
	// found it (for the console); a probe that fails records why in d.
	detect func(d *detecting) (found string, ok bool)
}

// SourceTable is every kind of evidence the agent can present, strongest
// first: the order --evidence auto tries them in.
func SourceTable() []SourceRow {
	return []SourceRow{
		{Kind: attest.KindGCEVTPM, Open: openGCEVTPM, detect: detectGCEVTPM,
			Help: "a Shielded VM's vTPM: Google's AK and its certificate from NV, refused without the certificate",
			Auto: "Google's AK template is in the TPM's NV"},
		{Kind: attest.KindAzureVTPM, Open: openAzureVTPM, detect: detectAzureVTPM,
			Help: "an Azure Trusted Launch VM's vTPM: Azure's AK and its certificate from NV, and IMDS's attested document naming the VM",
			Auto: "the TPM's NV holds Azure's AK certificate index (0x01C101D0)"},
		{Kind: attest.KindNitroTPM, Open: openNitroTPM, detect: detectNitroTPM,
			Help: "an EC2 NitroTPM: a Nitro attestation document over the AK and the instance identity document",
			Auto: "a TPM device exists and IMDSv2 answers (an EC2 instance)"},
		{Kind: attest.KindTPM, Open: openTPM, detect: detectTPM,
			Help: "the TPM at --tpm: its EK (--ek), a quote and the event log",
			Auto: "the TPM device exists, or --tpm names swtpm"},
		{Kind: attest.KindGCP, Open: openGCP, detect: detectGCP,
			Help: "an instance identity token from the GCE metadata server; GCE_METADATA_HOST overrides its address",
			Auto: "the metadata server answers as GCE's does"},
		{Kind: attest.KindAWS, Open: openAWS, detect: detectAWS,
			Help: "the instance identity document over IMDSv2; AWS_EC2_METADATA_SERVICE_ENDPOINT overrides it",
			Auto: "IMDS issues an IMDSv2 session token"},
	}
}

// Sources are the kinds of evidence the agent can present, by kind
// (SourceTable's Open).
func Sources() map[attest.Kind]Source {
	out := map[attest.Kind]Source{}
	for _, r := range SourceTable() {
		out[r.Kind] = r.Open
	}
	return out
}

func openTPM(_ context.Context, o SourceOptions) (Evidence, io.Closer, error) {
	opened := time.Now()
	ch, err := openChannel(o)
	if err != nil {
		return nil, nil, err
	}
	kind := o.EKKind
	if kind == "" {
		kind = attest.EKKindRSA2048
	}
	var kept *keptAK
	opts := tpm.CollectorOptions{EKKind: kind}
	if o.AKState != "" {
		kept = openKeptAK(o.AKState)
		opts.AK = kept.st.AK
	}
	coll, err := tpm.NewCollectorWith(ch, opts)
	var c TPM = coll
	if o.Timing != nil {
		o.Timing.AddTPM(time.Since(opened)) // opening it, reading the EK, loading or making the AK
		c = o.Timing.TPM(coll)
	}
	if err != nil {
		return nil, nil, err
	}
	ev := TPMEvidence{Collector: c}
	if kept != nil {
		ev.Ticket, ev.Keep = kept.ticket(coll), kept.keep(coll)
		if kept.note != "" && o.Console != nil {
			console(o.Console)("%s", kept.note)
		}
	}
	return ev, coll, nil
}

func openGCP(context.Context, SourceOptions) (Evidence, io.Closer, error) {
	return GCPEvidence{}, nil, nil
}

func openAWS(_ context.Context, o SourceOptions) (Evidence, io.Closer, error) {
	return AWSEvidence{IMDS: aws.NewIMDSClient(o.IMDSEndpoint)}, nil, nil
}

func openGCEVTPM(ctx context.Context, o SourceOptions) (Evidence, io.Closer, error) {
	ch, err := openChannel(o)
	if err != nil {
		return nil, nil, err
	}
	coll, err := gcevtpm.NewCollector(ctx, ch, gcevtpm.CollectorOptions{})
	if err != nil {
		return nil, nil, err
	}
	return GCEVTPMEvidence{Collector: coll}, coll, nil
}

func openAzureVTPM(ctx context.Context, o SourceOptions) (Evidence, io.Closer, error) {
	ch, err := openChannel(o)
	if err != nil {
		return nil, nil, err
	}
	coll, err := azuretpm.NewCollector(ctx, ch, azuretpm.CollectorOptions{IMDS: o.AzureIMDS})
	if err != nil {
		return nil, nil, err
	}
	return AzureVTPMEvidence{Collector: coll}, coll, nil
}

func openNitroTPM(_ context.Context, o SourceOptions) (Evidence, io.Closer, error) {
	ch, err := openChannel(o)
	if err != nil {
		return nil, nil, err
	}
	coll, err := nitrotpm.NewCollector(ch, o.NSM)
	if err != nil {
		return nil, nil, err
	}
	return NitroTPMEvidence{Collector: coll, IMDS: aws.NewIMDSClient(o.IMDSEndpoint)}, coll, nil
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
