package liveboot

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/pe"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf16"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	"github.com/nodeproof/nodeproof/attest/uefivar"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/fsutil"
)

// Secure Boot of our own: keys no Microsoft or Debian key stands behind,
// for the tests that need a signer other than Debian's, a db that holds
// it, a machine-owner key (MOK), and a dbx of real revocations. The keys
// are made once and kept in the cache (cache/secureboot/keys), and so is
// the variable store enrolled with them (EnsureVars), made by OVMF itself:
// its UEFI shell, in setup mode, sets the variables from a file
// (`dmpstore -all -l`) holding the updates efitools' sign-efi-sig-list
// signed — the firmware's own authenticated-variable code checks and
// stores them. (efitools' UpdateVars.efi, the usual tool, prints garbage
// and sets nothing on Debian 12's OVMF; virt-fw-vars is not in Debian 12.)

const (
	secureBootCacheDir = "secureboot"
	// OVMFCodeShell is OVMF without SMM, with the UEFI shell: the
	// enrolment boot runs it (a store it writes boots the Secure Boot
	// build).
	OVMFCodeShell = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	// UEFI variable attributes: non-volatile, boot-service and runtime
	// access, time-based authenticated writes.
	attrNVBS   = 0x03
	attrNVBSRT = 0x07
	attrAuth   = attrNVBSRT | 0x20
)

// GUIDs as written and as stored (mixed endian).
const (
	efiGlobalGUID  = "8be4df61-93ca-11d2-aa0d-00e098032b8c"
	imageDBGUID    = "d719b2cb-3d3a-4596-a3bc-dad00e67656f"
	shimLockGUID   = "605dab50-e046-4300-abb6-3dd810dd8b23"
	testOwnerGUID  = "6e6f6465-7072-6f6f-6620-74657374206b" // the test keys' signature owner
	authVarStoreID = "aaf32c78-947b-439a-a180-2e144ec37792" // gEfiAuthenticatedVariableGuid
)

// KeyPair is one test key: its certificate and the PEM files sbsign and
// sign-efi-sig-list read.
type KeyPair struct {
	Cert              *x509.Certificate
	CertPath, KeyPath string
}

// SHA256 is the certificate's fingerprint (hex), as the claims name an
// authority.
func (k KeyPair) SHA256() string {
	s := sha256.Sum256(k.Cert.Raw)
	return hex.EncodeToString(s[:])
}

// SecureBootKeys are the test keys: PK and KEK (the platform's owner),
// a db CA and a signer it issued (images the firmware, or the shim
// checking db, accepts), a MOK CA and a signer it issued (images the shim
// accepts through its MokList).
type SecureBootKeys struct {
	Dir              string
	PK, KEK          KeyPair
	DBCA, DBSigner   KeyPair
	MOKCA, MOKSigner KeyPair
	Owner            string // the signature owner GUID of their list entries
	certs            map[string]*KeyPair
}

// keySpecs: name, subject, issuer ("" self), CA.
var keySpecs = []struct {
	name, subject, issuer string
	ca                    bool
}{
	{"PK", "nodeproof test PK", "", true},
	{"KEK", "nodeproof test KEK", "", true},
	{"db-ca", "nodeproof test db CA", "", true},
	{"db-signer", "nodeproof test db signer", "db-ca", false},
	{"mok-ca", "nodeproof test MOK CA", "", true},
	{"mok-signer", "nodeproof test MOK signer", "mok-ca", false},
}

// EnsureSecureBootKeys loads the test keys from cache/secureboot/keys, or
// makes them there (RSA-2048, SHA-256; 20 years): once, so that every
// store and image made with them stays valid.
func EnsureSecureBootKeys(cache string) (*SecureBootKeys, error) {
	dir := filepath.Join(cache, secureBootCacheDir, "keys")
	if _, err := os.Stat(filepath.Join(dir, "mok-signer.crt")); err != nil {
		if err := makeKeys(dir); err != nil {
			return nil, err
		}
	}
	k := &SecureBootKeys{Dir: dir, Owner: testOwnerGUID, certs: map[string]*KeyPair{}}
	for _, s := range keySpecs {
		p := KeyPair{CertPath: filepath.Join(dir, s.name+".crt"), KeyPath: filepath.Join(dir, s.name+".key")}
		b, err := os.ReadFile(p.CertPath)
		if err != nil {
			return nil, fmt.Errorf("liveboot: test keys: %w (delete %s to make them again)", err, dir)
		}
		blk, _ := pem.Decode(b)
		if blk == nil {
			return nil, fmt.Errorf("liveboot: %s is not PEM (delete %s)", p.CertPath, dir)
		}
		if p.Cert, err = x509.ParseCertificate(blk.Bytes); err != nil {
			return nil, fmt.Errorf("liveboot: %s: %w (delete %s)", p.CertPath, err, dir)
		}
		k.certs[s.name] = &p
	}
	k.PK, k.KEK, k.DBCA, k.DBSigner, k.MOKCA, k.MOKSigner = *k.certs["PK"], *k.certs["KEK"], *k.certs["db-ca"], *k.certs["db-signer"], *k.certs["mok-ca"], *k.certs["mok-signer"]
	return k, nil
}

func makeKeys(dir string) error {
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, ".keys-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	type made struct {
		cert *x509.Certificate
		key  *rsa.PrivateKey
	}
	all := map[string]made{}
	now := time.Now().Add(-time.Hour)
	for i, s := range keySpecs {
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(1000 + i)), Subject: pkix.Name{CommonName: s.subject, Organization: []string{"nodeproof tests"}},
			NotBefore: now, NotAfter: now.AddDate(20, 0, 0), BasicConstraintsValid: true, IsCA: s.ca,
			KeyUsage: x509.KeyUsageDigitalSignature,
		}
		if s.ca {
			tmpl.KeyUsage |= x509.KeyUsageCertSign
		} else {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning}
		}
		issuer, issuerKey := tmpl, key
		if s.issuer != "" {
			issuer, issuerKey = all[s.issuer].cert, all[s.issuer].key
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, &key.PublicKey, issuerKey)
		if err != nil {
			return err
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return err
		}
		all[s.name] = made{cert, key}
		if err := os.WriteFile(filepath.Join(tmp, s.name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tmp, s.name+".key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
			return err
		}
	}
	_ = os.RemoveAll(dir)
	return os.Rename(tmp, dir)
}

// Sign writes to dst a copy of the PE image src signed by k (sbsign):
// a signed src's signatures are removed first (sbattach --remove, which
// refuses an image without one), an unsigned src (BuildUKI's) is signed
// as it is. Either way its Authenticode digest is src's: the same code
// under another signer. src and dst may not be the same file.
func (k KeyPair) Sign(ctx context.Context, src, dst string) error {
	return k.sign(ctx, src, dst)
}

// SignCarrying is Sign with the issuer's certificate carried in the
// signature (sbsign --addcert), as a vendor's signature carries its CA:
// `policy learn --efi` then names the CA a db holds, which the firmware
// measures when it verifies the image.
func (k KeyPair) SignCarrying(ctx context.Context, src, dst string, issuer KeyPair) error {
	return k.sign(ctx, src, dst, "--addcert", issuer.CertPath)
}

func (k KeyPair) sign(ctx context.Context, src, dst string, extra ...string) error {
	signed, err := peSigned(src)
	if err != nil {
		return err
	}
	in := src
	if signed {
		tmp := dst + ".unsigned"
		defer os.Remove(tmp)
		if err := copyFile(src, tmp); err != nil {
			return err
		}
		if err := runTool(ctx, "sbattach", "--remove", tmp); err != nil {
			return err
		}
		in = tmp
	}
	args := append([]string{"--key", k.KeyPath, "--cert", k.CertPath}, extra...)
	return runTool(ctx, "sbsign", append(args, "--output", dst, in)...)
}

// peSigned says whether a PE image has an Authenticode signature: a
// non-empty certificate table (its security data directory).
func peSigned(path string) (bool, error) {
	f, err := pe.Open(path)
	if err != nil {
		return false, fmt.Errorf("liveboot: %s: %w", path, err)
	}
	defer f.Close()
	var dirs []pe.DataDirectory
	switch h := f.OptionalHeader.(type) {
	case *pe.OptionalHeader64:
		dirs = h.DataDirectory[:min(h.NumberOfRvaAndSizes, uint32(len(h.DataDirectory)))]
	case *pe.OptionalHeader32:
		dirs = h.DataDirectory[:min(h.NumberOfRvaAndSizes, uint32(len(h.DataDirectory)))]
	default:
		return false, fmt.Errorf("liveboot: %s has no PE optional header", path)
	}
	return len(dirs) > pe.IMAGE_DIRECTORY_ENTRY_SECURITY && dirs[pe.IMAGE_DIRECTORY_ENTRY_SECURITY].Size > 0, nil
}

// runTool runs one of efitools' or sbsigntool's programs.
func runTool(ctx context.Context, name string, args ...string) error {
	p, err := exec.LookPath(name)
	if err != nil {
		pkg := map[string]string{"sbattach": "sbsigntool", "sbsign": "sbsigntool"}[name]
		if pkg == "" {
			pkg = "efitools"
		}
		return fmt.Errorf("liveboot: %s not found: apt-get install %s (make deps does)", name, pkg)
	}
	cmd := exec.CommandContext(ctx, p, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("liveboot: %s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// VarStore is an OVMF variable store EnsureVars enrolled, and what it
// holds: each variable's EFI_SIGNATURE_LIST(s) as stored.
type VarStore struct {
	// Path is the store (boot it with Boot.Vars: a copy is used).
	Path string `json:"-"`
	// PK, KEK, DB, DBX and MokList are the lists enrolled. DB is
	// Microsoft's db (OVMF's: its UEFI CA verifies Debian's shim) and the
	// test db CA; MokList the test MOK CA, owned by the shim.
	PK, KEK, DB, DBX, MokList []byte
	// DBXEntries counts DBX's entries.
	DBXEntries int `json:"dbxEntries"`
}

// EnsureVars returns the variable store enrolled with keys and dbx (an
// EFI_SIGNATURE_LIST, such as a real machine's: RealDBX), making it when
// the cache lacks it (cache/secureboot/vars-<digest of what goes in>): a
// boot of OVMF's shell (OVMFCodeShell, ~10 s) in setup mode, whose
// startup.nsh sets KEK, db, dbx, MokList and, last, PK from a dmpstore
// file — each Secure Boot update signed by efitools' sign-efi-sig-list
// (db and dbx by the KEK, KEK and PK by the PK), MokList as the shim keeps
// it (non-volatile, boot services) — then powers off. The store is read
// back: each variable must hold exactly what was enrolled.
func EnsureVars(ctx context.Context, cache string, keys *SecureBootKeys, dbx []byte, say func(string, ...any)) (*VarStore, error) {
	msDB, err := StoreVariable(OVMFVarsMS, "db", imageDBGUID)
	if err != nil {
		return nil, fmt.Errorf("liveboot: Microsoft's db from %s: %w", OVMFVarsMS, err)
	}
	work, err := os.MkdirTemp(filepath.Join(cache, secureBootCacheDir), ".vars-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	esl := func(k KeyPair, owner string) ([]byte, error) {
		out := filepath.Join(work, filepath.Base(k.CertPath)+".esl")
		if err := runTool(ctx, "cert-to-efi-sig-list", "-g", owner, k.CertPath, out); err != nil {
			return nil, err
		}
		return os.ReadFile(out)
	}
	vs := &VarStore{DBX: dbx}
	if vs.PK, err = esl(keys.PK, keys.Owner); err != nil {
		return nil, err
	}
	if vs.KEK, err = esl(keys.KEK, keys.Owner); err != nil {
		return nil, err
	}
	ca, err := esl(keys.DBCA, keys.Owner)
	if err != nil {
		return nil, err
	}
	vs.DB = append(append([]byte(nil), msDB...), ca...)
	if vs.MokList, err = esl(keys.MOKCA, shimLockGUID); err != nil {
		return nil, err
	}
	if vs.DBXEntries, err = listEntries(dbx); err != nil {
		return nil, fmt.Errorf("liveboot: the dbx: %w", err)
	}
	code, err := fileDigest(OVMFCodeShell, OVMFVarsNoKeys)
	if err != nil {
		return nil, err
	}
	sum := sha256.New()
	for _, b := range [][]byte{code, vs.PK, vs.KEK, vs.DB, vs.DBX, vs.MokList} {
		fmt.Fprintf(sum, "%d:", len(b))
		sum.Write(b)
	}
	dir := filepath.Join(cache, secureBootCacheDir, "vars-"+hex.EncodeToString(sum.Sum(nil))[:16])
	if b, err := os.ReadFile(filepath.Join(dir, "vars.json")); err == nil {
		if json.Unmarshal(b, vs) == nil {
			vs.Path = filepath.Join(dir, "vars.fd")
			if _, err := os.Stat(vs.Path); err == nil {
				say("Secure Boot variables: cached (%s)", dir)
				return vs, nil
			}
		}
	}
	signed := func(name string, list []byte, signer KeyPair) ([]byte, error) {
		in, out := filepath.Join(work, name+".esl"), filepath.Join(work, name+".auth")
		if err := os.WriteFile(in, list, 0o600); err != nil {
			return nil, err
		}
		if err := runTool(ctx, "sign-efi-sig-list", "-k", signer.KeyPath, "-c", signer.CertPath, name, in, out); err != nil {
			return nil, err
		}
		return os.ReadFile(out)
	}
	var dmp []byte
	for _, v := range []struct {
		name, guid string
		list       []byte
		signer     *KeyPair
	}{
		{"KEK", efiGlobalGUID, vs.KEK, &keys.PK},
		{"db", imageDBGUID, vs.DB, &keys.KEK},
		{"dbx", imageDBGUID, vs.DBX, &keys.KEK},
		{"MokList", shimLockGUID, vs.MokList, nil},
		{"PK", efiGlobalGUID, vs.PK, &keys.PK}, // last: it ends setup mode
	} {
		data, attrs := v.list, uint32(attrNVBS)
		if v.signer != nil {
			if data, err = signed(v.name, v.list, *v.signer); err != nil {
				return nil, err
			}
			attrs = attrAuth
		}
		dmp = append(dmp, dmpstoreEntry(v.name, v.guid, attrs, data)...)
	}
	disk := filepath.Join(work, "enrol.img")
	if err := BuildDisk(ctx, disk, map[string]File{
		"/keys.dmp":    {Data: dmp},
		"/startup.nsh": {Data: []byte("fs0:\r\ndmpstore -all -l keys.dmp\r\nreset -s\r\n")},
	}); err != nil {
		return nil, err
	}
	vars := filepath.Join(work, "vars.fd")
	if err := copyFile(OVMFVarsNoKeys, vars); err != nil {
		return nil, err
	}
	say("Secure Boot variables: enrolling the test PK, KEK, db, dbx (%d entries) and MokList with OVMF's shell", vs.DBXEntries)
	start := time.Now()
	console, err := runFirmware(ctx, OVMFCodeShell, vars, disk, 3*time.Minute)
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, console)
	}
	for _, want := range []struct{ name, guid string }{{"KEK", efiGlobalGUID}, {"db", imageDBGUID}, {"dbx", imageDBGUID}, {"MokList", shimLockGUID}, {"PK", efiGlobalGUID}} {
		if !strings.Contains(strings.ToLower(console), strings.ToLower(want.guid+":"+want.name+"'")) {
			return nil, fmt.Errorf("liveboot: the enrolment boot did not set %s:\n%s", want.name, console)
		}
	}
	for _, v := range []struct {
		name, guid string
		want       []byte
	}{{"PK", efiGlobalGUID, vs.PK}, {"KEK", efiGlobalGUID, vs.KEK}, {"db", imageDBGUID, vs.DB}, {"dbx", imageDBGUID, vs.DBX}, {"MokList", shimLockGUID, vs.MokList}} {
		got, err := StoreVariable(vars, v.name, v.guid)
		if err != nil || !bytes.Equal(got, v.want) {
			return nil, fmt.Errorf("liveboot: the enrolled store's %s is not what was enrolled (%v)", v.name, err)
		}
	}
	say("Secure Boot variables: enrolled in %.1fs", time.Since(start).Seconds())
	b, err := json.MarshalIndent(vs, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(work, "vars.json"), b, 0o644); err != nil {
		return nil, err
	}
	_ = os.Remove(disk)
	_ = os.RemoveAll(dir)
	if err := os.Rename(work, dir); err != nil {
		return nil, err
	}
	vs.Path = filepath.Join(dir, "vars.fd")
	return vs, nil
}

// fileDigest is the SHA-256 of files' contents, in order.
func fileDigest(files ...string) ([]byte, error) {
	h := sha256.New()
	for _, f := range files {
		in, err := os.Open(f)
		if err != nil {
			return nil, fmt.Errorf("liveboot: %w (apt-get install ovmf; make deps does)", err)
		}
		_, err = io.Copy(h, in)
		in.Close()
		if err != nil {
			return nil, err
		}
	}
	return h.Sum(nil), nil
}

// runFirmware boots firmware code with the variable store vars (written
// in place) and disk, no TPM, until it powers off; it returns the console.
func runFirmware(ctx context.Context, code, vars, disk string, limit time.Duration) (string, error) {
	qemu, err := lookTool(qemuBinary)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu,
		"-machine", "q35", "-accel", "tcg", "-cpu", "max", "-m", "512", "-smp", "1",
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+code,
		"-drive", "if=pflash,format=raw,unit=1,file="+vars,
		"-drive", "if=none,id=d0,format=raw,file="+disk, "-device", "virtio-blk-pci,drive=d0",
		"-nographic", "-no-reboot", "-monitor", "none", "-serial", "stdio", "-net", "none")
	cmd.SysProcAttr = procAttr()
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	var b strings.Builder
	for _, l := range strings.Split(string(out), "\n") {
		b.WriteString(cleanLine(l))
		b.WriteByte('\n')
	}
	if ctx.Err() != nil {
		return b.String(), fmt.Errorf("liveboot: the firmware did not power off within %s", limit)
	}
	if err != nil {
		return b.String(), fmt.Errorf("liveboot: %s: %w", qemuBinary, err)
	}
	return b.String(), nil
}

// dmpstoreEntry is one variable as the UEFI shell's `dmpstore -s` saves
// it and `-l` loads it: name size and data size (UINT32), the UCS-2 name
// with its NUL, the vendor GUID, the attributes (UINT32), the data, and a
// CRC32 of all that.
func dmpstoreEntry(name, guid string, attrs uint32, data []byte) []byte {
	n := utf16.Encode([]rune(name + "\x00"))
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint32(2*len(n)))
	binary.Write(&b, binary.LittleEndian, uint32(len(data)))
	binary.Write(&b, binary.LittleEndian, n)
	b.Write(guidBytes(guid))
	binary.Write(&b, binary.LittleEndian, attrs)
	b.Write(data)
	binary.Write(&b, binary.LittleEndian, crc32.ChecksumIEEE(b.Bytes()))
	return b.Bytes()
}

// guidBytes is a GUID as UEFI stores it (the first three fields
// little-endian).
func guidBytes(g string) []byte {
	h, err := hex.DecodeString(strings.ReplaceAll(g, "-", ""))
	if err != nil || len(h) != 16 {
		panic("liveboot: bad GUID " + g)
	}
	out := append([]byte(nil), h...)
	out[0], out[1], out[2], out[3] = h[3], h[2], h[1], h[0]
	out[4], out[5] = h[5], h[4]
	out[6], out[7] = h[7], h[6]
	return out
}

// StoreVariable reads a variable from an OVMF variable store file: the
// firmware volume's authenticated variable store (the FV header, then
// the store header at its HeaderLength, then 4-byte-aligned
// AUTHENTICATED_VARIABLE_HEADERs: StartId 0x55AA, State, Attributes,
// MonotonicCount, TimeStamp, PubKeyIndex, NameSize, DataSize, VendorGuid,
// then name and data). The data of the one added (State 0x3F) copy.
func StoreVariable(path, name, guid string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) < 0x38 || string(b[0x28:0x2c]) != "_FVH" {
		return nil, errors.New("not a firmware volume")
	}
	off := int(binary.LittleEndian.Uint16(b[0x30:]))
	if off+28 > len(b) || !bytes.Equal(b[off:off+16], guidBytes(authVarStoreID)) {
		return nil, errors.New("no authenticated variable store")
	}
	end := off + int(binary.LittleEndian.Uint32(b[off+16:]))
	if end > len(b) {
		end = len(b)
	}
	wantName := utf16.Encode([]rune(name + "\x00"))
	wantGUID := guidBytes(guid)
	var found []byte
	for p := off + 28; p+60 <= end; {
		if binary.LittleEndian.Uint16(b[p:]) != 0x55aa {
			break
		}
		state := b[p+2]
		ns, ds := int(binary.LittleEndian.Uint32(b[p+36:])), int(binary.LittleEndian.Uint32(b[p+40:]))
		if ns < 0 || ds < 0 || p+60+ns+ds > end {
			return nil, errors.New("a variable runs past the store")
		}
		if state == 0x3f && bytes.Equal(b[p+44:p+60], wantGUID) && ns == 2*len(wantName) {
			same := true
			for i, c := range wantName {
				if binary.LittleEndian.Uint16(b[p+60+2*i:]) != c {
					same = false
					break
				}
			}
			if same {
				found = b[p+60+ns : p+60+ns+ds]
			}
		}
		p = (p + 60 + ns + ds + 3) &^ 3
	}
	if found == nil {
		return nil, fmt.Errorf("no variable %s", name)
	}
	return found, nil
}

// listEntries counts the entries of EFI_SIGNATURE_LISTs (attest/uefivar's
// checks).
func listEntries(b []byte) (int, error) {
	return uefivar.Walk(b, func(uefivar.Entry) error { return nil })
}

// RealDBX is a real machine's dbx: the one firmware-testdata's rhel8-uefi
// log measured (a GCE VM, 2021) — 183 revoked image hashes and 3 revoked
// certificates (Canonical's 2017 signing key, a Cisco CA, Debian's first
// signer, not its 2022 signers) — read with go-eventlog.
func RealDBX() ([]byte, error) {
	return MeasuredVariable(firmwaretestdata.MustLog("rhel8-uefi"), "dbx")
}

// MeasuredVariable is the data of a UEFI variable a log measured into
// PCR 7 (its SHA-256 events), read with go-eventlog.
func MeasuredVariable(raw []byte, name string) ([]byte, error) {
	el, err := tcg.ParseEventLog(raw, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		return nil, err
	}
	for _, e := range el.Events(register.HashSHA256) {
		if e.Index != 7 || e.Type != tcg.EFIVariableDriverConfig {
			continue
		}
		v, err := tcg.ParseUEFIVariableData(bytes.NewReader(e.Data))
		if err == nil && string(utf16.Decode(v.UnicodeName)) == name {
			return v.VariableData, nil
		}
	}
	return nil, fmt.Errorf("liveboot: the log measured no %s", name)
}
