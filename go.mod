module github.com/nodeproof/nodeproof

go 1.26

require (
	github.com/google/go-attestation v0.6.4
	github.com/google/go-eventlog v0.0.3-0.20260617163629-883cc5652c69
	github.com/google/go-tpm v0.9.8
	gopkg.in/yaml.v3 v3.0.1
)

require (
	github.com/google/go-tpm-tools v0.4.10 // indirect
	golang.org/x/sys v0.45.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
