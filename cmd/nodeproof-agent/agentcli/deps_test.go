package agentcli

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestAgentImportsNoServerCode: the initramfs binary must stay small and
// must not carry server code, client-go, or the server's cloud API
// clients.
func TestAgentImportsNoServerCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`,
		"github.com/nodeproof/nodeproof/cmd/nodeproof-agent").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var deps []string
	importers := map[string][]string{} // package -> the agent's packages importing it
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		deps = append(deps, f[0])
		for _, imp := range f[1:] {
			importers[imp] = append(importers[imp], f[0])
		}
	}
	if !slices.Contains(deps, "github.com/nodeproof/nodeproof/agent") {
		t.Fatalf("go list does not list the agent package: %s", out)
	}
	forbidden := []struct {
		name, pkg string
		exact     bool // only pkg itself, not the packages under it
	}{
		{name: "client-go and the Kubernetes API", pkg: "k8s.io"},
		{name: "controller-runtime", pkg: "sigs.k8s.io"},
		{name: "the embedded store", pkg: "go.etcd.io/bbolt"},
		{name: "nodeproof's store", pkg: "github.com/nodeproof/nodeproof/store"},
		{name: "the approver", pkg: "github.com/nodeproof/nodeproof/approver"},
		{name: "the server's commands", pkg: "github.com/nodeproof/nodeproof/cmd/nodeproof/cli"},
		{name: "the server package", pkg: "github.com/nodeproof/nodeproof/mcs", exact: true},
		{name: "rendering", pkg: "github.com/nodeproof/nodeproof/mcs/render"},
		{name: "cluster mode", pkg: "github.com/nodeproof/nodeproof/mcs/cluster"},
		{name: "session sealing", pkg: "github.com/nodeproof/nodeproof/mcs/seal"},
		{name: "provisioning tokens", pkg: "github.com/nodeproof/nodeproof/mcs/tokens"},
		{name: "the server's CA", pkg: "github.com/nodeproof/nodeproof/mcs/certs"},
		{name: "user-data Secrets", pkg: "github.com/nodeproof/nodeproof/mcs/userdata"},
		{name: "rate limits", pkg: "github.com/nodeproof/nodeproof/mcs/limit"},
		// The server's EC2 live check (identity/aws/ec2live) and what it
		// calls EC2 with; the agent only reads IMDS.
		{name: "the EC2 live check", pkg: "github.com/nodeproof/nodeproof/identity/aws/ec2live"},
		{name: "the EC2 API client", pkg: "github.com/aws/aws-sdk-go-v2/service/ec2"},
		{name: "the AWS SDK's configuration", pkg: "github.com/aws/aws-sdk-go-v2/config"},
		{name: "the AWS SDK's credential providers", pkg: "github.com/aws/aws-sdk-go-v2/credentials"},
	}
	for _, f := range forbidden {
		t.Run(f.name, func(t *testing.T) {
			for _, d := range deps {
				if d == f.pkg || (!f.exact && strings.HasPrefix(d, f.pkg+"/")) {
					t.Errorf("nodeproof-agent links %s (%s), imported by %s", d, f.name, strings.Join(importers[d], ", "))
				}
			}
		})
	}
}
