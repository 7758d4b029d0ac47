// Package bigconfig makes a rendered MachineConfig the size of a real one
// for the benchmarks: about 500 KB of file contents, like a rendered
// worker config with its certificates, kubelet and CRI-O configs and units.
package bigconfig

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"

	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
)

// Files and FileSize give about 500 KB of contents.
const (
	Files    = 100
	FileSize = 5000
)

// Grow adds Files files of FileSize random (incompressible) characters to
// mc's Ignition config and returns how many bytes of contents it added.
func Grow(mc *mcfgv1.MachineConfig) (int, error) {
	var cfg map[string]any
	if err := json.Unmarshal(mc.Spec.Config.Raw, &cfg); err != nil {
		return 0, err
	}
	storage, _ := cfg["storage"].(map[string]any)
	if storage == nil {
		storage = map[string]any{}
		cfg["storage"] = storage
	}
	files, _ := storage["files"].([]any)
	total := 0
	for i := range Files {
		raw := make([]byte, FileSize*3/4)
		if _, err := rand.Read(raw); err != nil {
			return 0, err
		}
		content := base64.StdEncoding.EncodeToString(raw)
		total += len(content)
		files = append(files, map[string]any{
			"path": fmt.Sprintf("/etc/bench/file-%03d.conf", i), "mode": 420, "overwrite": true,
			"contents": map[string]any{"source": "data:," + url.PathEscape(content)},
		})
	}
	storage["files"] = files
	var err error
	mc.Spec.Config.Raw, err = json.Marshal(cfg)
	return total, err
}
