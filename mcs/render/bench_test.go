package render

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"testing"

	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// bigRenderer builds a pool whose rendered MachineConfig is about size
// bytes of Ignition (files of base64 data, like MCO templates write).
func bigRenderer(b *testing.B, size int) (*Renderer, int) {
	b.Helper()
	type file struct {
		Path      string            `json:"path"`
		Mode      int               `json:"mode"`
		Overwrite bool              `json:"overwrite"`
		Contents  map[string]string `json:"contents"`
	}
	var files []file
	total := 0
	for i := 0; total < size; i++ {
		chunk := make([]byte, 0, 2048)
		for len(chunk) < 2048 {
			h := sha256.Sum256([]byte(fmt.Sprint(i, len(chunk))))
			chunk = append(chunk, h[:]...)
		}
		src := "data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString(chunk)
		files = append(files, file{Path: fmt.Sprintf("/etc/nodeproof-bench/file-%04d.conf", i), Mode: 420, Overwrite: true, Contents: map[string]string{"source": src}})
		total += len(src) + 100
	}
	raw, err := json.Marshal(map[string]any{"ignition": map[string]string{"version": "3.5.0"}, "storage": map[string]any{"files": files}})
	if err != nil {
		b.Fatal(err)
	}
	mc := mkMC("rendered-worker-bench", "", string(raw), nil)
	cc := &mcfgv1.ControllerConfig{ObjectMeta: metav1.ObjectMeta{Name: "machine-config-controller"}}
	cc.Spec.KubeAPIServerServingCAData = []byte(exampleKubeletCA)
	in, err := NewInputs([]*mcfgv1.MachineConfigPool{mkPool("worker", "rendered-worker-bench")}, []*mcfgv1.MachineConfig{mc}, cc)
	if err != nil {
		b.Fatal(err)
	}
	r, err := NewRenderer(in, Options{BootstrapKubeconfig: []byte(fmt.Sprintf(exampleBootstrapKubeconfig, "Q0E="))})
	if err != nil {
		b.Fatal(err)
	}
	return r, len(raw)
}

// BenchmarkConfig: serving a ~500 KB rendered config from the cache, and
// splicing a per-node kubeconfig into it; for scale, one uncached render.
func BenchmarkConfig(b *testing.B) {
	r, rawSize := bigRenderer(b, 500<<10)
	full, err := r.Config("worker", TierFull, V3_5)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("rendered config %d KB, full tier %d KB", rawSize>>10, len(full)>>10)
	for _, v := range []Version{V3_5, V2_2} {
		b.Run("cached/full/"+v.String(), func(b *testing.B) {
			if _, err := r.Config("worker", TierFull, v); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := r.Config("worker", TierFull, v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("cached/public/3.5.0", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.Config("worker", TierPublic, V3_5); err != nil {
				b.Fatal(err)
			}
		}
	})
	kc := []byte(fmt.Sprintf(exampleBootstrapKubeconfig, base64.StdEncoding.EncodeToString([]byte(exampleRootCA))))
	b.Run("FullWithKubeconfig/3.5.0", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(full)))
		for b.Loop() {
			if _, err := r.FullWithKubeconfig("worker", V3_5, kc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("render-uncached/3.5.0", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.renderFull(r.pools["worker"], V3_5, kc); err != nil {
				b.Fatal(err)
			}
		}
	})
}
