package main

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

func lookTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed: apt-get install -y %s (make test does this, hack/deps.sh): %v", name, pkg, err)
	}
	return p
}

// TestImage builds the image twice and reads it back: one index with
// linux/amd64 and linux/arm64, each running nodeproof as a non-root user
// with both binaries and the CA bundle, the same digest and archive bytes
// both times; skopeo reads both platforms from the archive, podman loads
// it, and the amd64 image's nodeproof prints its version.
func TestImage(t *testing.T) {
	ctx := context.Background()
	o := Options{Root: "../..", Version: "v0.0.0-test", Epoch: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC),
		CACerts: "/etc/ssl/certs/ca-certificates.crt", Log: t.Logf}
	o.Out = t.TempDir()
	r1, err := Build(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	want, err := ImageRef("../../deploy/image/kustomization.yaml")
	if err != nil || r1.Ref != want {
		t.Fatalf("image named %s, want deploy/image's %s (%v)", r1.Ref, want, err)
	}
	o.Out = t.TempDir()
	r2, err := Build(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Digest != r2.Digest || fileSum(t, r1.Archive) != fileSum(t, r2.Archive) {
		t.Errorf("two builds of one commit: %s and %s; want the same digest and archive", r1.Digest, r2.Digest)
	}

	// Read the archive back (not the layout Build wrote beside it).
	dir := t.TempDir()
	untar(t, r1.Archive, dir)
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil || len(tm.Manifests) != 1 || tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != strings.Split(want, ":")[1] {
		t.Fatalf("index.json: %+v (%v); want one index named by its tag", tm, err)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := idx.Digest(); d != r1.Digest {
		t.Errorf("the archive's index is %s, Build said %s", d, r1.Digest)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	platforms := map[string]v1.Image{}
	for _, m := range im.Manifests {
		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		p := m.Platform.OS + "/" + m.Platform.Architecture
		platforms[p] = img
		if cf.OS+"/"+cf.Architecture != p {
			t.Errorf("%s: config says %s/%s", p, cf.OS, cf.Architecture)
		}
		if got := strings.Join(cf.Config.Entrypoint, " "); got != "/usr/bin/nodeproof" {
			t.Errorf("%s: entrypoint %q", p, got)
		}
		if cf.Config.User != User || strings.HasPrefix(cf.Config.User, "0") || cf.Config.User == "root" {
			t.Errorf("%s: user %q, want %s (not root)", p, cf.Config.User, User)
		}
		if !cf.Created.Time.Equal(o.Epoch) {
			t.Errorf("%s: created %s, want the commit's time", p, cf.Created)
		}
		files := layerFiles(t, img)
		for _, f := range []string{"usr/bin/nodeproof", "usr/bin/nodeproof-agent"} {
			if h, ok := files[f]; !ok || h.Mode&0o111 == 0 || h.Uid != 0 || h.Mode&0o022 != 0 {
				t.Errorf("%s: %s %+v; want an executable owned by root, writable by no one else", p, f, h)
			}
		}
		if _, ok := files["etc/ssl/certs/ca-certificates.crt"]; !ok {
			t.Errorf("%s: no CA bundle", p)
		}
		if _, ok := files["bin/sh"]; ok {
			t.Errorf("%s: a shell", p)
		}
	}
	if len(platforms) != 2 || platforms["linux/amd64"] == nil || platforms["linux/arm64"] == nil {
		t.Fatalf("platforms %v; want linux/amd64 and linux/arm64", platforms)
	}

	// The amd64 image's nodeproof, as the image holds it, runs.
	bin := filepath.Join(t.TempDir(), "nodeproof")
	extract(t, platforms["linux/amd64"], "usr/bin/nodeproof", bin)
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "nodeproof v0.0.0-test" {
		t.Errorf("nodeproof version from the image: %q, %v", out, err)
	}

	// The real tools read the archive.
	skopeo := lookTool(t, "skopeo", "skopeo")
	for _, arch := range []string{"amd64", "arm64"} {
		out, err := exec.Command(skopeo, "inspect", "--override-os", "linux", "--override-arch", arch, "oci-archive:"+r1.Archive+":"+strings.Split(want, ":")[1]).Output()
		var got struct{ Architecture, Os, Digest string }
		if err != nil || json.Unmarshal(out, &got) != nil || got.Architecture != arch || got.Os != "linux" || got.Digest != r1.Digest.String() {
			t.Errorf("skopeo inspect (%s): %+v, %v", arch, got, err)
		}
	}
	podman := lookTool(t, "podman", "podman")
	store := t.TempDir()
	pm := func(args ...string) (string, error) {
		out, err := exec.Command(podman, append([]string{"--root", filepath.Join(store, "root"), "--runroot", filepath.Join(store, "run")}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := pm("load", "-i", r1.Archive); err != nil || !strings.Contains(out, want) {
		t.Fatalf("podman load: %v\n%s", err, out)
	}
	if out, err := pm("image", "inspect", "--format", "{{.Config.User}} {{.Os}}/{{.Architecture}}", want); err != nil || strings.TrimSpace(out) != User+" linux/amd64" {
		t.Errorf("podman image inspect: %q, %v", out, err)
	}
	t.Cleanup(func() { pm("system", "reset", "--force") })
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	if out, err := exec.Command("tar", "-C", dir, "-xf", archive).CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v\n%s", err, out)
	}
}

// layerFiles lists the image's files by name.
func layerFiles(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(h.Name, "./")] = h
	}
}

// extract writes the image's file name to path, executable.
func extract(t *testing.T, img v1.Image, name, path string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s not in the image: %v", name, err)
		}
		if strings.TrimPrefix(h.Name, "./") != name {
			continue
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o755)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := io.Copy(f, tr); err != nil {
			t.Fatal(err)
		}
		return
	}
}
