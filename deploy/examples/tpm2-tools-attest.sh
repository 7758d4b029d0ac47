#!/usr/bin/env bash
# Attest a machine to nodeproof with the standard TPM tools — tpm2-tools,
# curl, openssl, jq — and fetch its full config: what an integrator who
# does not run nodeproof-agent does. docs/tpm.md describes every field;
# systemtest's TestTPM2ToolsScript runs this script against swtpm and a
# real server.
#
# Settings (environment):
#   NODEPROOF_SERVER   https://api-int.example.com:22623 (required)
#   NODEPROOF_CA       the server's CA bundle, PEM (required)
#   NODEPROOF_POOL     the pool (default worker)
#   NODEPROOF_NODE     the node name to ask for (used where the pool takes requested names)
#   NODEPROOF_OUT      where to write the full config (default ./config.ign, mode 0600)
#   EVENT_LOG          the firmware event log (default: securityfs's)
#   TPM2TOOLS_TCTI     how tpm2-tools reach the TPM (default: /dev/tpmrm0)
#   NODEPROOF_QUOTE_BANKS   PCR selection to quote (default sha1 and sha256 of PCRs 0-9)
#   WORK               a scratch directory (default: a new temporary one)
#
# Exit status: 0 with the config written; the server's refusal (JSON with
# "reason" and "detail") is printed and the script exits 3; anything else 1.
set -euo pipefail

server=${NODEPROOF_SERVER:?set NODEPROOF_SERVER}
ca=${NODEPROOF_CA:?set NODEPROOF_CA}
pool=${NODEPROOF_POOL:-worker}
node=${NODEPROOF_NODE:-}
out=${NODEPROOF_OUT:-config.ign}
log=${EVENT_LOG:-/sys/kernel/security/tpm0/binary_bios_measurements}
pcrs=0,1,2,3,4,5,6,7,8,9
banks=${NODEPROOF_QUOTE_BANKS:-sha1:$pcrs+sha256:$pcrs}
work=${WORK:-$(mktemp -d)}
case $out in /*) ;; *) out=$PWD/$out ;; esac
case $ca in /*) ;; *) ca=$PWD/$ca ;; esac
case $log in /*) ;; *) log=$PWD/$log ;; esac
cd "$work"

b64() { base64 -w0 "$1"; }
# t runs one tpm2-tools command, then flushes transient objects: without a
# resource manager (swtpm, tpm2-abrmd absent) every loaded context stays
# in the TPM's few slots; the saved context files load again when needed.
t() {
	"$@" >/dev/null
	tpm2_flushcontext -t >/dev/null 2>&1 || true
}
# post PATH FILE: the server's answer in PATH.out; a refusal ends the script.
post() {
	local code
	code=$(curl -sS --cacert "$ca" -H 'Content-Type: application/json' --data-binary @"$2" -o "$1.out" -w '%{http_code}' "$server/attest/v1/$1")
	if [ "$code" != 200 ]; then
		echo "refused at $1 (HTTP $code): $(cat "$1.out")" >&2
		exit 3
	fi
}

# 1. The endorsement key (its public key as PKIX DER) and its certificate
#    (the TCG's RSA EK certificate index; a TPM without one needs the
#    server's EK inventory instead).
t tpm2_createek -c ek.ctx -G rsa -u ek.pub
t tpm2_readpublic -c ek.ctx -f der -o ek.der
ekcert=""
if tpm2_nvread 0x01c00002 -C 0x01c00002 -o ekcert.der >/dev/null 2>&1; then
	ekcert=$(b64 ekcert.der)
fi

# 2. An attestation key under the EK: a restricted ECDSA P-256 signing key.
#    tpm2_createak writes its public area as a TPM2B_PUBLIC (the server
#    takes it with or without the size) and no creation data (credential
#    activation proves the AK is this TPM's).
t tpm2_createak -C ek.ctx -c ak.ctx -G ecc -g sha256 -s ecdsa -u ak.pub -n ak.name -r ak.priv

# 3. The kubelet's key: the evidence binds its public key's SHA-256.
if [ ! -f kubelet.key ]; then
	openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out kubelet.key 2>/dev/null
fi
openssl pkey -in kubelet.key -pubout -outform DER -out kubelet.der
openssl dgst -sha256 -binary kubelet.der >kubelet.sha256

# 4. The challenge.
jq -n --arg pool "$pool" --arg node "$node" --arg kub "$(b64 kubelet.der)" \
	--arg ek "$(b64 ek.der)" --arg ekcert "$ekcert" --arg ak "$(b64 ak.pub)" \
	'{kind: "tpm", pool: $pool, nodeName: $node, kubeletPublicKey: $kub,
	  tpm: ({ekPublic: $ek, ak: {public: $ak}} + (if $ekcert == "" then {} else {ekCertificate: $ekcert} end))}' >challenge.json
post challenge challenge.json
jq -r .session challenge.out >session
jq -r .tpm.nonce challenge.out | base64 -d >nonce.bin
jq -r .tpm.credential challenge.out | base64 -d >credential.bin
jq -r .tpm.secret challenge.out | base64 -d >secret.bin

# 5. Activate the credential: tpm2_activatecredential reads
#    tpm2_makecredential's file — magic 0xBADCC0DE, version 1 (4 bytes
#    each, big-endian), then the TPM2B_ID_OBJECT and the
#    TPM2B_ENCRYPTED_SECRET exactly as the server sent them. The EK's
#    policy is PolicySecret(endorsement hierarchy).
printf '\xba\xdc\xc0\xde\x00\x00\x00\x01' >cred.in
cat credential.bin secret.bin >>cred.in
t tpm2_startauthsession --policy-session -S ek.session
t tpm2_policysecret -S ek.session -c e
t tpm2_activatecredential -c ak.ctx -C ek.ctx -i cred.in -o activated.bin -P session:ek.session
t tpm2_flushcontext ek.session

# 6. The quote's qualifying data binds the session's nonce and the kubelet
#    key: SHA-256("nodeproof/v1 attestation binding" || 0x00 || nonce ||
#    SHA-256(kubelet public key, PKIX DER)). Not the raw nonce.
binding=$({ printf 'nodeproof/v1 attestation binding\0'; cat nonce.bin kubelet.sha256; } | openssl dgst -sha256 -hex | sed 's/.*= //')
t tpm2_quote -c ak.ctx -l "$banks" -q "$binding" -m quote.msg -s quote.sig -o pcrs.bin -F values -g sha256

# 7. The PCR values: -F values writes them bank by bank in the selection's
#    order, PCRs ascending, as the quote's digest hashes them.
pcrjson="[]"
off=0
IFS=+ read -ra sels <<<"$banks"
for sel in "${sels[@]}"; do
	bank=${sel%%:*}
	case $bank in sha1) size=20 ;; sha256) size=32 ;; sha384) size=48 ;; *) echo "bank $bank?" >&2; exit 1 ;; esac
	IFS=, read -ra idx <<<"${sel#*:}"
	for i in "${idx[@]}"; do
		d=$(dd if=pcrs.bin bs=1 skip="$off" count="$size" 2>/dev/null | base64 -w0)
		pcrjson=$(jq -c --argjson i "$i" --arg b "$bank" --arg d "$d" '. + [{index: $i, bank: $b, digest: $d}]' <<<"$pcrjson")
		off=$((off + size))
	done
done

# 8. Verify: the config token comes back.
jq -n --arg s "$(cat session)" --arg k "$(b64 kubelet.sha256)" --arg a "$(b64 activated.bin)" \
	--arg q "$(b64 quote.msg)" --arg qs "$(b64 quote.sig)" --argjson p "$pcrjson" --arg log "$(b64 "$log")" \
	'{session: $s, tpm: {kubeletKeySHA256: $k, activationSecret: $a, quotes: [{quote: $q, signature: $qs}], pcrs: $p, eventLog: $log}}' >verify.json
post verify verify.json
token=$(jq -r .configToken verify.out)
echo "attested: node $(jq -r .nodeName verify.out), pool $(jq -r .pool verify.out), record $(jq -r .record verify.out)"

# 9. The full config, once, with the single-use config token.
umask 077
code=$(curl -sS --cacert "$ca" -H "Authorization: Bearer $token" -o "$out" -w '%{http_code}' "$server/config/$pool")
if [ "$code" != 200 ]; then
	echo "config fetch refused (HTTP $code): $(cat "$out")" >&2
	exit 3
fi
echo "wrote $out ($(wc -c <"$out") bytes)"
