package nitrotpm

import (
	"regexp"
	"strings"

	"github.com/nodeproof/nodeproof/attest"
)

// How a document names its instance. AWS does not document module_id's
// format, but every NitroTPM document seen names the instance twice, both
// inside what AWS signs: module_id is "<instance id>-tpm<16 hex digits>",
// and the leaf certificate's common name is "<module_id>.<region>.aws"
// (its issuer, a per-instance CA, "<instance id>.<region>.aws.nitro-
// enclaves"). nodeproof reads the instance and the Region from both and
// requires them to agree with each other and with the instance identity
// document: a document whose names have another shape is refused
// (NitroDocumentInstanceMismatch), never read as naming no instance.
// Failing closed costs a release if AWS changes the format; failing open
// would let any instance's fresh document vouch for another instance's
// identity document, which carries no nonce and may have leaked.
var (
	moduleIDRE = regexp.MustCompile(`^(i-[0-9a-f]{8,17})-tpm[0-9a-f]{1,32}$`)
	regionRE   = regexp.MustCompile(`^[a-z]{2,8}(-[a-z]+)+-[0-9]{1,3}$`)
)

// InstanceOf returns the instance ID and the Region the document names:
// the instance from module_id, the Region from the leaf certificate's
// common name, which must be module_id, the Region and "aws", dot-joined
// (NitroDocumentInstanceMismatch otherwise). The document's signature is
// the caller's to have verified.
func InstanceOf(d *Document) (instanceID, region string, err error) {
	m := moduleIDRE.FindStringSubmatch(d.ModuleID)
	if m == nil {
		return "", "", attest.Deny(attest.ReasonNitroInstance, "module_id %q is not <instance id>-tpm<hex>: the document names no instance nodeproof can read", d.ModuleID)
	}
	cn := d.Certificate.Subject.CommonName
	rest, ok := strings.CutPrefix(cn, d.ModuleID+".")
	if !ok {
		return "", "", attest.Deny(attest.ReasonNitroInstance, "the document's certificate %q is not for module %q", cn, d.ModuleID)
	}
	region, ok = strings.CutSuffix(rest, ".aws")
	if !ok || !regionRE.MatchString(region) {
		return "", "", attest.Deny(attest.ReasonNitroInstance, "the document's certificate %q names no Region", cn)
	}
	return m[1], region, nil
}
