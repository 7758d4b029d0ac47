package swtpm

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/google/go-tpm-tools/client"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	sw "github.com/nodeproof/nodeproof/attest/tpm/swtpm"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// Machine is a simulated node: a freshly provisioned swtpm whose PCRs hold
// a real firmware event log, a TPM collector on it, and a kubelet key.
type Machine struct {
	TPM        *TPM
	Collector  *tpm.Collector
	Kubelet    *ecdsa.PrivateKey
	KubeletDER []byte // PKIX
	KubeletSHA []byte
}

// NewMachine provisions a TPM from m in dir (with the given PCR banks, or
// SHA-1 and SHA-256), starts it, "boots" it by extending log into its
// PCRs, and opens a collector that reports log.
func (m *Manufacturer) NewMachine(ctx context.Context, dir string, log []byte, banks ...string) (*Machine, error) {
	state := filepath.Join(dir, "tpm")
	if err := m.Provision(ctx, state, banks...); err != nil {
		return nil, err
	}
	p, err := Start(ctx, state)
	if err != nil {
		return nil, err
	}
	mc := &Machine{TPM: p}
	fail := func(err error) (*Machine, error) { mc.Close(); return nil, err }
	ch, err := tpm.DialSocket("tcp", p.Addr, log)
	if err != nil {
		return fail(err)
	}
	if len(log) > 0 {
		if _, err := sw.ExtendLog(ch, log); err != nil {
			ch.Close()
			return fail(err)
		}
	}
	if mc.Collector, err = tpm.NewCollector(ch); err != nil {
		ch.Close()
		return fail(err)
	}
	if mc.Kubelet, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return fail(err)
	}
	if mc.KubeletDER, err = x509.MarshalPKIXPublicKey(mc.Kubelet.Public()); err != nil {
		return fail(err)
	}
	if mc.KubeletSHA, err = attest.KeySHA256(mc.KubeletDER); err != nil {
		return fail(err)
	}
	return mc, nil
}

// Boot provisions a TPM from m in dir (with the given PCR banks, or SHA-1
// and SHA-256), starts it and "boots" it by extending log into its PCRs,
// as the clouds' test VMs (gcevtpmtest, azuretpmtest) begin. It returns
// the TPM and an open channel to it that reports log, for the caller to
// provision further and close; on an error the TPM is stopped.
func (m *Manufacturer) Boot(ctx context.Context, dir string, log []byte, banks ...string) (*TPM, *tpm.SocketChannel, error) {
	state := filepath.Join(dir, "tpm")
	if err := m.Provision(ctx, state, banks...); err != nil {
		return nil, nil, err
	}
	p, err := Start(ctx, state)
	if err != nil {
		return nil, nil, err
	}
	ch, err := tpm.DialSocket("tcp", p.Addr, log)
	if err != nil {
		p.Stop()
		return nil, nil, err
	}
	if len(log) > 0 {
		if _, err := sw.ExtendLog(ch, log); err != nil {
			ch.Close()
			p.Stop()
			return nil, nil, err
		}
	}
	return p, ch, nil
}

// Close closes the collector and stops swtpm.
func (mc *Machine) Close() error {
	var err error
	if mc.Collector != nil {
		err = mc.Collector.Close()
	}
	mc.TPM.Stop()
	return errors.Join(err)
}

// Reboot reboots the machine's TPM (TPM.Reboot) and "boots" it with log:
// its events extended into the fresh PCRs, as the firmware of that boot
// would. The collector, if open, is closed (its connection is gone); open
// a new one, or let the agent open the TPM itself.
func (mc *Machine) Reboot(ctx context.Context, log []byte) error {
	if mc.Collector != nil {
		mc.Collector.Close()
		mc.Collector = nil
	}
	if err := mc.TPM.Reboot(ctx); err != nil {
		return err
	}
	ch, err := tpm.DialSocket("tcp", mc.TPM.Addr, log)
	if err != nil {
		return err
	}
	defer ch.Close()
	_, err = sw.ExtendLog(ch, log)
	return err
}

// AddECCEK gives the machine's TPM what most discrete TPMs ship beside
// their RSA EK: an ECC P-256 EK (the TCG's default template, which
// go-attestation reads) certified by the same manufacturer, its
// certificate in NV 0x01c0000a. The collector is reopened on that EK;
// the machine's RSA EK and its certificate stay as they were: one TPM,
// two certified EKs.
func (mc *Machine) AddECCEK(m *Manufacturer, log []byte) error {
	if mc.Collector != nil {
		mc.Collector.Close()
		mc.Collector = nil
	}
	ch, err := tpm.DialSocket("tcp", mc.TPM.Addr, log)
	if err != nil {
		return err
	}
	// go-tpm-tools makes the EK from the TCG's default ECC template and
	// persists it where TPMs keep it (EK Credential Profile: 0x81010002).
	ek, err := client.EndorsementKeyECC(ch)
	if err != nil {
		ch.Close()
		return fmt.Errorf("ECC EK: %w", err)
	}
	pub := ek.PublicKey()
	ek.Close()
	ca, err := tpmtest.LocalCA(m.Dir)
	if err != nil {
		ch.Close()
		return err
	}
	cert, err := ca.IssueEK(pub, time.Now())
	if err != nil {
		ch.Close()
		return err
	}
	if err := tpmtest.ProvisionEKCertAt(ch, tpmtest.ECCEKCertNVIndex, cert); err != nil {
		ch.Close()
		return err
	}
	if mc.Collector, err = tpm.NewCollectorEK(ch, attest.EKKindECCP256); err != nil {
		ch.Close()
		return err
	}
	return nil
}
