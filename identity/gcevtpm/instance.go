package gcevtpm

import (
	"crypto/x509"
	"encoding/asn1"
	"math/big"
	"regexp"
	"strconv"

	"github.com/nodeproof/nodeproof/attest"
)

// OIDInstanceInfo is Google's cloudComputeInstanceIdentifier extension
// (1.3.6.1.4.1.11129.2.1.21), which Google puts in the certificates it
// issues for a VM's vTPM keys: the instance the key belongs to.
var OIDInstanceInfo = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 11129, 2, 1, 21}

// MaxInstanceInfoSize bounds the extension's value. Google's are about
// 110 bytes; names are bounded far below this (zone 63, project ID 63 or
// a domain-scoped one of 100-odd, instance name 63).
const MaxInstanceInfoSize = 1024

// InstanceInfo is the instance extension's content:
//
//	InstanceInfo ::= SEQUENCE {
//	  zone                UTF8String,
//	  projectNumber       INTEGER,
//	  projectId           UTF8String,
//	  instanceId          INTEGER,
//	  instanceName        UTF8String,
//	  securityProperties  [0] EXPLICIT SEQUENCE {
//	    securityVersion   [0] EXPLICIT INTEGER OPTIONAL,
//	    isProduction      [1] EXPLICIT BOOLEAN OPTIONAL,
//	    ...               ([2]..[5] in certificates seen from Google; not read)
//	  } OPTIONAL
//	}
//
// (the layout go-tpm-tools' server package and GKE's removed node-identity
// code read, checked against certificates from real GCE VMs in testdata/).
type InstanceInfo struct {
	Zone          string
	ProjectNumber uint64
	ProjectID     string
	InstanceID    uint64
	InstanceName  string
	// SecurityVersion and IsProduction are the security properties; an
	// absent IsProduction is false.
	SecurityVersion uint64
	IsProduction    bool
}

type rawInstanceInfo struct {
	Zone               string `asn1:"utf8"`
	ProjectNumber      *big.Int
	ProjectID          string `asn1:"utf8"`
	InstanceID         *big.Int
	InstanceName       string                `asn1:"utf8"`
	SecurityProperties rawSecurityProperties `asn1:"explicit,tag:0,optional"`
}

type rawSecurityProperties struct {
	SecurityVersion *big.Int `asn1:"explicit,tag:0,optional"`
	IsProduction    bool     `asn1:"explicit,tag:1,optional"`
}

// Shapes of the names, checked so that a claim never carries a name GCE
// would not give (and a path or label built from one stays what it says).
var (
	zoneRE = regexp.MustCompile(`^[a-z]+(-[a-z0-9]+)+$`)
	// projectIDRE: 6-30 characters, lower-case letters, digits and
	// hyphens, optionally behind a domain ("google.com:my-project").
	projectIDRE = regexp.MustCompile(`^([a-z0-9][a-z0-9.-]{0,62}[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$`)
	// instanceNameRE: RFC 1035 label, 1-63 characters.
	instanceNameRE = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
)

var maxUint64 = new(big.Int).SetUint64(^uint64(0))

func uint64Of(b *big.Int, field string) (uint64, error) {
	if b == nil || b.Sign() < 0 || b.Cmp(maxUint64) > 0 {
		return 0, attest.Deny(attest.ReasonInstanceInfoMalformed, "instance extension: %s out of range", field)
	}
	return b.Uint64(), nil
}

// ParseInstanceInfo reads the instance extension's value (DER). It refuses,
// with GCEInstanceInfoMalformed, a value over MaxInstanceInfoSize, one that
// does not parse as the layout above or has bytes after it, a negative or
// over-64-bit number, and a zone, project ID or instance name of a shape
// GCE does not give. isProduction is returned, not judged:
// InstanceFromCertificate refuses false.
func ParseInstanceInfo(der []byte) (*InstanceInfo, error) {
	if len(der) > MaxInstanceInfoSize {
		return nil, attest.Deny(attest.ReasonInstanceInfoMalformed, "instance extension of %d bytes exceeds %d", len(der), MaxInstanceInfoSize)
	}
	var raw rawInstanceInfo
	rest, err := asn1.Unmarshal(der, &raw)
	if err != nil {
		return nil, attest.Deny(attest.ReasonInstanceInfoMalformed, "instance extension does not parse: %v", err)
	}
	if len(rest) != 0 {
		return nil, attest.Deny(attest.ReasonInstanceInfoMalformed, "instance extension has %d bytes after its value", len(rest))
	}
	info := &InstanceInfo{Zone: raw.Zone, ProjectID: raw.ProjectID, InstanceName: raw.InstanceName, IsProduction: raw.SecurityProperties.IsProduction}
	if info.ProjectNumber, err = uint64Of(raw.ProjectNumber, "projectNumber"); err != nil {
		return nil, err
	}
	if info.InstanceID, err = uint64Of(raw.InstanceID, "instanceId"); err != nil {
		return nil, err
	}
	if raw.SecurityProperties.SecurityVersion != nil {
		if info.SecurityVersion, err = uint64Of(raw.SecurityProperties.SecurityVersion, "securityVersion"); err != nil {
			return nil, err
		}
	}
	switch {
	case info.ProjectNumber == 0 || info.InstanceID == 0:
		return nil, attest.Deny(attest.ReasonInstanceInfoMalformed, "instance extension: project number or instance ID is zero")
	case !zoneRE.MatchString(info.Zone) || len(info.Zone) > 63:
		return nil, attest.Deny(attest.ReasonInstanceInfoMalformed, "instance extension: zone %q is not a GCE zone", info.Zone)
	case !projectIDRE.MatchString(info.ProjectID):
		return nil, attest.Deny(attest.ReasonInstanceInfoMalformed, "instance extension: project ID %q is not a GCP project ID", info.ProjectID)
	case !instanceNameRE.MatchString(info.InstanceName):
		return nil, attest.Deny(attest.ReasonInstanceInfoMalformed, "instance extension: instance name %q is not a GCE instance name", info.InstanceName)
	}
	return info, nil
}

// InstanceFromCertificate returns the instance a Google-issued vTPM key
// certificate names. Unlike go-tpm-tools' GetGCEInstanceInfo, which
// answers nil and no error for both, a certificate without the extension
// is GCEInstanceInfoMissing, and isProduction false (or absent) is
// GCEInstanceNotProduction. The extension must appear once
// (GCEInstanceInfoMalformed).
func InstanceFromCertificate(cert *x509.Certificate) (*InstanceInfo, error) {
	var val []byte
	n := 0
	for _, ext := range cert.Extensions {
		if ext.Id.Equal(OIDInstanceInfo) {
			val = ext.Value
			n++
		}
	}
	switch n {
	case 0:
		return nil, attest.Deny(attest.ReasonInstanceInfoMissing, "the AK certificate names no GCE instance (no extension %s)", OIDInstanceInfo)
	case 1:
	default:
		return nil, attest.Deny(attest.ReasonInstanceInfoMalformed, "the AK certificate has the instance extension %d times", n)
	}
	info, err := ParseInstanceInfo(val)
	if err != nil {
		return nil, err
	}
	if !info.IsProduction {
		return nil, attest.Deny(attest.ReasonNotProduction, "the AK certificate's instance extension says isProduction false: not a production Google host")
	}
	return info, nil
}

// Identity is the instance's identity, the form identity/gcp gives the
// same instance: "gcp:<project number>/<zone>/<instance id>". One machine
// has one identity whichever evidence it enrols with, so a node name
// bound to it stays bound (docs/cloud-tpm.md).
func (i *InstanceInfo) Identity() string {
	return "gcp:" + strconv.FormatUint(i.ProjectNumber, 10) + "/" + i.Zone + "/" + strconv.FormatUint(i.InstanceID, 10)
}
