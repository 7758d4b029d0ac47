package render

import (
	"encoding/json"
	"net/url"

	"github.com/coreos/ignition/v2/config/v3_5/types"
)

// CABundlePath is where the public tier puts the MCS CA bundle, so the node
// agent can reach the server over TLS after the first boot.
const CABundlePath = "/etc/nodeproof/mcs-ca-bundle.crt"

// CABundleExtra is what the server adds to every public tier
// (Options.PublicExtra): the CA bundle at CABundlePath, what a node needs
// to attest (the agent unit comes with the agent's MachineConfig). No
// secret. An empty bundle adds nothing (nil).
func CABundleExtra(caBundle []byte) ([]byte, error) {
	if len(caBundle) == 0 {
		return nil, nil
	}
	mode := 0o644
	overwrite := true
	src := "data:," + url.PathEscape(string(caBundle))
	cfg := types.Config{Ignition: types.Ignition{Version: "3.5.0"}}
	cfg.Storage.Files = append(cfg.Storage.Files, types.File{
		Node:          types.Node{Path: CABundlePath, Overwrite: &overwrite},
		FileEmbedded1: types.FileEmbedded1{Mode: &mode, Contents: types.Resource{Source: &src}},
	})
	return json.Marshal(cfg)
}
