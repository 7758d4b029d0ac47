# nodeproof — `make demo` and `make test` do everything on a fresh machine.
SHELL := /bin/bash
GO    ?= go
# Built tools (Ignition, kube-apiserver, etcd) are cached by version in
# $NODEPROOF_CACHE, default ~/.cache/nodeproof (hack/tools.sh).

.PHONY: all deps tools build test vet demo dev-cluster bench-tpm bench-cloud bench-mcs image fmt

all: build

deps: ## OS packages: swtpm, swtpm-tools, tpm2-tools, gcc, libssl-dev, libblkid-dev, sslscan, haproxy, skopeo, podman, jq, curl, openssl; for the live boot qemu-system-x86, ovmf, mtools, dosfstools, fdisk, busybox-static, sbsigntool, efitools, binutils
	@hack/deps.sh

tools: deps ## real Ignition, kube-apiserver, etcd for tests, the live boot's kubelet, kube-controller-manager and Debian boot chain, cached under ~/.cache/nodeproof (or $NODEPROOF_CACHE)
	@hack/tools.sh

# The version `nodeproof version` prints: git describe, as make image builds in.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

build: ## bin/nodeproof and bin/nodeproof-agent (bin/ is git-ignored); every other package compiled too
	@mkdir -p bin
	$(GO) build -trimpath -ldflags '-X github.com/nodeproof/nodeproof/cmd/nodeproof/cli.Version=$(VERSION)' -o bin/ ./cmd/nodeproof ./cmd/nodeproof-agent
	@ln -sfn nodeproof bin/kubectl-nodeproof  # kubectl nodeproof inspect: a kubectl plugin
	@hack/progress.sh "go build ./..." $(GO) build ./...
	@echo "built bin/nodeproof and bin/nodeproof-agent ($(VERSION)); add $(CURDIR)/bin to PATH, or copy them to /usr/local/bin"

vet:
	@hack/progress.sh "go vet" $(GO) vet ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi

test: deps tools vet ## everything: vet, gofmt, unit and integration tests on real parts, then the live boot (test-boot) on its own
	@hack/progress.sh "go test" $(GO) test -count=1 -timeout 20m $$($(GO) list ./... | grep -v '/internal/liveboot$$')
	@$(MAKE) --no-print-directory test-boot-only

.PHONY: test-boot test-boot-only demo-boot bench-boot
test-boot: deps tools test-boot-only ## a real machine boots (QEMU, OVMF Secure Boot, swtpm, Debian's signed shim, GRUB and kernel; the agent in the initramfs): enrol, reboot, a published dbx revocation (the running node tainted, an updated dbx and chain clear it), own Secure Boot keys (a test db key, a real dbx, a MOK), kernel B under signer, digest and audit rules, the whole boot (a tampered initramfs, command line and grub.cfg refused, a kernel update learned from its files admitted, a rollback refused), unified kernel images (one learned from its file admitted, another signer's refused, a new one admitted), Secure Boot off, no event log (fifteen boots), and a dracut + systemd initramfs with Ignition's own units, in pointer mode (refused, applied, retried, and a signed UKI of it whose systemd measures its boot phase) and the cloud path with a real root (refused, applied, retried) (~15-20 min; consoles kept in $$NODEPROOF_ARTIFACTS on failure)

test-boot-only:
	@$(GO) test -count=1 -timeout 30m -v ./internal/liveboot

demo-boot: deps tools ## make demo's story on a live VM: it boots with Secure Boot (enrols, Ignition, kubelet CSR approved), reboots (re-attests), boots with Secure Boot off (refused, tainted); narrated
	@hack/progress.sh "building the demo and the guest's programs" bash -c '$(GO) build -o $${TMPDIR:-/tmp}/nodeproof-demo ./cmd/nodeproof-demo && CGO_ENABLED=0 $(GO) build -ldflags "-s -w" -o $${TMPDIR:-/tmp}/nodeproof-guest/ ./cmd/nodeproof-agent ./internal/liveboot/kubeletcsr'
	$${TMPDIR:-/tmp}/nodeproof-demo --boot --guest-bin $${TMPDIR:-/tmp}/nodeproof-guest

bench-boot: deps tools ## the live boot's figures: seconds per boot without the agent, enrolling, re-attesting, from a UKI the firmware runs (without the agent, re-attesting), and a dracut + systemd first boot beside a busybox one; the agent's share split into TPM, network and server time (7 boots)
	$(GO) test -count=1 -timeout 30m -run '^$$' -bench '^BenchmarkLiveBoot' -benchtime 1x ./internal/liveboot

demo: deps tools build ## the whole flow, each command printed: an API server, the operator's guide's cluster part (deploy, policy, serve, approve), a swtpm machine attests and its kubelet CSR is approved, then its life: re-attestation, a refused one and the taint, inspect, revoke and its refusal
	@hack/progress.sh "building the demo" $(GO) build -o $${TMPDIR:-/tmp}/nodeproof-demo ./cmd/nodeproof-demo
	$${TMPDIR:-/tmp}/nodeproof-demo -bin bin

dev-cluster: tools ## a cluster of your own to try cluster mode (etcd and kube-apiserver from make tools, in first-day/cluster): prints its kubeconfig; Ctrl-C stops it
	@hack/progress.sh "building nodeproof-demo" $(GO) build -o $${TMPDIR:-/tmp}/nodeproof-demo ./cmd/nodeproof-demo
	$${TMPDIR:-/tmp}/nodeproof-demo -cluster -dir first-day/cluster

bench-tpm: ## server-side TPM verification vs the crypto floor, same run
	@hack/bench-tpm.sh

bench-cloud: ## one verification of each cloud kind (GCP identity token, AWS identity document, GCE vTPM, AWS NitroTPM), each beside its crypto floor in the same process, ROUNDS rounds: median ratio and range
	@hack/bench-cloud.sh

bench-mcs: ## config serving over TLS, limits off (the serving path) and with the default limits from many source addresses (a fleet): req/s, p50/p99, CPU/request, RSS vs a bare Go TLS server, same run; fails on any error
	$(GO) build -o $${TMPDIR:-/tmp}/nodeproof-bench ./cmd/nodeproof
	$(GO) run ./bench/mcs --nodeproof $${TMPDIR:-/tmp}/nodeproof-bench $(BENCH_MCS_FLAGS)

image: ## the container image (nodeproof + nodeproof-agent, linux/amd64 + linux/arm64, non-root, no base image) as an OCI archive in bin/image/, named by deploy/image
	@hack/progress.sh "building the image" $(GO) run ./hack/image -o bin/image

fmt:
	gofmt -w $$(git ls-files '*.go')

.PHONY: generate
generate: ## deepcopy (store/kubestore/v1alpha1/zz_generated.deepcopy.go) and CRDs (deploy/crds/) from the Go types, with the cached controller-gen; the MCO's CRDs (deploy/crds/openshift/) from the openshift/api go.mod pins
	@hack/tools.sh controller-gen
	@cg=$${NODEPROOF_CACHE:-$$HOME/.cache/nodeproof}/bin/controller-gen-$$(sed -n 's/^CONTROLLER_TOOLS_VERSION=\([^ ]*\).*/\1/p' hack/tools.sh)/controller-gen; \
	  set -x; \
	  "$$cg" object paths=./store/kubestore/v1alpha1/... && \
	  "$$cg" crd paths=./store/kubestore/v1alpha1/... output:crd:dir=deploy/crds
	@src=$$($(GO) mod download -json github.com/openshift/api | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p')/machineconfiguration/v1/zz_generated.crd-manifests; \
	  set -x; \
	  for r in machineconfigs machineconfigpools controllerconfigs-Default; do \
	    install -m 0644 "$$src"/0000_80_machine-config_01_$$r.crd.yaml deploy/crds/openshift/ || exit 1; \
	  done

.PHONY: attacks
attacks: deps tools ## every attack and fault test, as one table: attack, expected outcome, result (fails if any is not as expected)
	@hack/attacks.sh

.PHONY: fuzz
fuzz: ## every fuzz target (docs/fuzzing.md), one at a time, for FUZZTIME each (default 30s; FUZZ=regexp picks targets): one line per target with execs, new corpus entries, result
	@hack/fuzz.sh

.PHONY: bench
bench: tools ## 1,000 machines at once (TPM model, GCP, AWS): attest, fetch ~500 KB, CSR approved on a real API server; first run generates 1,000 RSA EK keys (~2 min, cached)
	$(GO) run ./bench/scale $(BENCH_FLAGS)

.PHONY: bench-approver
bench-approver: tools ## kubelet client CSRs of 200 machines at once on a real kube-apiserver: CSRs/s, p50/p99, approver CPU/CSR vs a trivial approver, same run
	$(GO) build -o $${TMPDIR:-/tmp}/nodeproof-bench-approver ./bench/approver
	$${TMPDIR:-/tmp}/nodeproof-bench-approver $(BENCH_APPROVER_FLAGS)
