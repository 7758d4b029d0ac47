package systemtest

import "encoding/json"

// ConfigFiles maps each file of an Ignition 3 config (JSON) to its
// contents' source (a data: URL; "" for a file without contents): what a
// test compares a served config by.
func ConfigFiles(cfgJSON []byte) (map[string]string, error) {
	var cfg struct {
		Storage struct {
			Files []struct {
				Path     string `json:"path"`
				Contents struct {
					Source *string `json:"source"`
				} `json:"contents"`
			} `json:"files"`
		} `json:"storage"`
	}
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, f := range cfg.Storage.Files {
		src := ""
		if f.Contents.Source != nil {
			src = *f.Contents.Source
		}
		out[f.Path] = src
	}
	return out, nil
}
