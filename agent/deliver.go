package agent

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	ign35 "github.com/coreos/ignition/v2/config/v3_5"
	ign35types "github.com/coreos/ignition/v2/config/v3_5/types"
	"github.com/vincent-petithory/dataurl"

	"github.com/nodeproof/nodeproof/fsutil"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// UserConfigName is the file in Ignition's system config directory that
// Ignition takes as the user config before asking the platform (Ignition
// v2 internal/providers/system: the kernel command line first, then
// <system config dir>/user.ign, then the platform's user data).
const UserConfigName = "user.ign"

// DefaultIgnitionDir is Ignition's system config directory as distributions
// build it (IGNITION_SYSTEM_CONFIG_DIR overrides it for Ignition; pass the
// same directory here).
const DefaultIgnitionDir = "/usr/lib/ignition"

// WriteUserConfig writes full (the node's full config, as the server
// served it) as <dir>/user.ign, Ignition's user config in its system
// config directory, so that Ignition's fetch stage applies it (mode 1,
// before Ignition). The file is mode 0600: it holds the node's secrets,
// in the initramfs's memory, as Ignition's own fetched copy does.
func WriteUserConfig(dir string, full []byte) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, UserConfigName)
	return path, fsutil.WriteFileAtomic(path, full, 0o600)
}

// kubeconfigPath is the kubelet's bootstrap kubeconfig (render.KubeconfigPath).
const kubeconfigPath = "/etc/kubernetes/kubeconfig"

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// maxFileSize bounds one decoded file.
const maxFileSize = 16 << 20

// WriteFirstBootFiles writes the api.FirstBootFiles that full (an Ignition
// 3.x config as the server serves it) carries, under root, with their
// modes (default 0644; 0600 for the pull secret and the kubeconfig when
// the config gives none), and returns the paths written (mode 2, on first
// boot after Ignition applied the public tier). Only data: URLs (what the
// server serves for these files) are accepted, optionally gzip-compressed.
// The bootstrap kubeconfig is written last: its presence says the
// first-boot files are all there (nodeproof-agent-firstboot.service is
// skipped when it exists).
func WriteFirstBootFiles(root string, full []byte) ([]string, error) {
	cfg, rpt, err := ign35.Parse(full)
	if err != nil {
		return nil, fmt.Errorf("agent: full config: %w", err)
	}
	if rpt.IsFatal() {
		return nil, fmt.Errorf("agent: full config: %s", rpt.String())
	}
	files := slices.Clone(cfg.Storage.Files)
	slices.SortStableFunc(files, func(a, b ign35types.File) int {
		return cmp.Compare(boolInt(a.Path == kubeconfigPath), boolInt(b.Path == kubeconfigPath))
	})
	var wrote []string
	for _, f := range files {
		if !slices.Contains(api.FirstBootFiles, f.Path) || f.Contents.Source == nil {
			continue
		}
		data, err := decodeSource(*f.Contents.Source, f.Contents.Compression)
		if err != nil {
			return wrote, fmt.Errorf("agent: %s: %w", f.Path, err)
		}
		mode := os.FileMode(0o644)
		if f.Path == "/var/lib/kubelet/config.json" || f.Path == kubeconfigPath {
			mode = 0o600
		}
		if f.Mode != nil {
			mode = os.FileMode(*f.Mode) & 0o777
		}
		dst := filepath.Join(root, f.Path)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return wrote, err
		}
		if err := fsutil.WriteFileAtomic(dst, data, mode); err != nil {
			return wrote, err
		}
		wrote = append(wrote, f.Path)
	}
	if len(wrote) == 0 {
		return nil, errors.New("agent: the full config carries none of the first-boot files")
	}
	return wrote, nil
}

// ConfigFile returns the contents of the file at path in an Ignition 3.x
// config (any 3.x spec, Ignition's own cache included), decoded from its
// data: URL, gunzipped when the config says so.
func ConfigFile(config []byte, path string) ([]byte, error) {
	var c struct {
		Storage struct {
			Files []struct {
				Path     string `json:"path"`
				Contents struct {
					Source      *string `json:"source"`
					Compression *string `json:"compression"`
				} `json:"contents"`
			} `json:"files"`
		} `json:"storage"`
	}
	if err := json.Unmarshal(config, &c); err != nil {
		return nil, fmt.Errorf("agent: config: %w", err)
	}
	for _, f := range c.Storage.Files {
		if f.Path == path && f.Contents.Source != nil {
			data, err := decodeSource(*f.Contents.Source, f.Contents.Compression)
			if err != nil {
				return nil, fmt.Errorf("agent: %s: %w", path, err)
			}
			return data, nil
		}
	}
	return nil, fmt.Errorf("agent: the config has no file %s", path)
}

func decodeSource(src string, compression *string) ([]byte, error) {
	if !strings.HasPrefix(src, "data:") {
		return nil, errors.New("only data: URLs are written")
	}
	du, err := dataurl.DecodeString(src)
	if err != nil {
		return nil, err
	}
	data := du.Data
	if compression != nil && *compression == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, err
		}
		if data, err = io.ReadAll(io.LimitReader(zr, maxFileSize+1)); err != nil {
			return nil, err
		}
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("larger than %d bytes", maxFileSize)
	}
	return data, nil
}
