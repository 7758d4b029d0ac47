// Command image builds nodeproof's container image, offline: static
// binaries of nodeproof and nodeproof-agent for linux/amd64 and
// linux/arm64, each in a one-layer image on no base (no shell, no package
// manager: the binaries, the CA certificates for outbound TLS, a
// non-root user), put together as one OCI image index with
// github.com/google/go-containerregistry and written as an OCI image
// layout, then archived (oci-archive, as skopeo and podman read it).
//
// The image's name and tag come from deploy/image/kustomization.yaml,
// the kustomize component every manifest in deploy/ takes its image
// from. Two builds of the same commit give the same digest: -trimpath,
// no build ID, the commit's time for every file and the image's
// creation, sorted entries, fixed owners and modes (GNU tar makes the
// layer and the archive).
//
//	go run ./hack/image [-o bin/image] [-version V]    (make image)
package main

import (
	"compress/gzip"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sigs.k8s.io/yaml"
)

// User is the image's user: not root (distroless's "nonroot").
const User = "65532:65532"

// Platforms the index holds.
var Platforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64", Variant: "v8"}}

// Binaries in the image, under /usr/bin; the first is the entrypoint.
var Binaries = []string{"nodeproof", "nodeproof-agent"}

// Options of a build.
type Options struct {
	// Root is the module's directory.
	Root string
	// Out is the output directory: Out/oci (the layout) and
	// Out/nodeproof.oci.tar (the archive).
	Out string
	// Version is built into the binaries (cli.Version) and labels the
	// image.
	Version string
	// Epoch is every file's time and the image's creation time.
	Epoch time.Time
	// CACerts is the CA bundle put at /etc/ssl/certs/ca-certificates.crt.
	CACerts string
	// Log, when set, is told what happens.
	Log func(format string, args ...any)
}

// Result is what a build wrote.
type Result struct {
	Ref     string  // name:tag, from deploy/image
	Digest  v1.Hash // the image index's
	Archive string  // the oci-archive
	Layout  string  // the OCI image layout directory
}

func main() {
	var o Options
	flag.StringVar(&o.Out, "o", "bin/image", "output directory (git-ignored)")
	flag.StringVar(&o.Version, "version", "", "version to build in (default: git describe)")
	flag.StringVar(&o.CACerts, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", "CA bundle for outbound TLS (GCP keys, AWS API)")
	flag.Parse()
	o.Root = "."
	o.Log = func(f string, a ...any) { fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+f+"\n", a...) }
	r, err := Build(context.Background(), o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("%s@%s\n%s\n", r.Ref, r.Digest, r.Archive)
}

// Build builds the image index and writes it.
func Build(ctx context.Context, o Options) (*Result, error) {
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	ref, err := ImageRef(filepath.Join(o.Root, "deploy", "image", "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	if o.Version == "" || o.Epoch.IsZero() {
		v, epoch, err := gitVersion(ctx, o.Root)
		if err != nil {
			return nil, err
		}
		if o.Version == "" {
			o.Version = v
		}
		if o.Epoch.IsZero() {
			o.Epoch = epoch
		}
	}
	ca, err := os.ReadFile(o.CACerts)
	if err != nil {
		return nil, fmt.Errorf("CA certificates (apt-get install ca-certificates): %w", err)
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range Platforms {
		start := time.Now()
		img, err := platformImage(ctx, o, p, ca)
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w", p.OS, p.Architecture, err)
		}
		o.Log("built %s/%s in %s", p.OS, p.Architecture, time.Since(start).Round(time.Second))
		pc := p
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &pc}})
	}
	digest, err := idx.Digest()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(o.Out, "oci")
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return nil, err
	}
	_, tag, _ := strings.Cut(ref[strings.LastIndex(ref, "/")+1:], ":")
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag,
		"io.containerd.image.name":          ref,
	})); err != nil {
		return nil, err
	}
	archive := filepath.Join(o.Out, "nodeproof.oci.tar")
	if err := tarDir(ctx, dir, archive, o.Epoch, "."); err != nil {
		return nil, err
	}
	o.Log("wrote %s (%s@%s)", archive, ref, digest)
	return &Result{Ref: ref, Digest: digest, Archive: archive, Layout: dir}, nil
}

// ImageRef reads name:tag from the kustomize component's images entry.
func ImageRef(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var k struct {
		Images []struct {
			Name, NewName, NewTag string
		}
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if len(k.Images) != 1 || k.Images[0].Name != "nodeproof" || k.Images[0].NewName == "" || k.Images[0].NewTag == "" {
		return "", fmt.Errorf("%s: want one images entry, name nodeproof, with newName and newTag", path)
	}
	return k.Images[0].NewName + ":" + k.Images[0].NewTag, nil
}

// platformImage is one platform's image: the static binaries and the CA
// bundle in one layer, run as a non-root user.
func platformImage(ctx context.Context, o Options, p v1.Platform, ca []byte) (v1.Image, error) {
	stage := filepath.Join(o.Out, "build", p.OS+"-"+p.Architecture)
	if err := os.RemoveAll(stage); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(stage, "etc", "ssl", "certs"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(stage, "etc", "ssl", "certs", "ca-certificates.crt"), ca, 0o644); err != nil {
		return nil, err
	}
	for _, b := range Binaries {
		if err := goBuild(ctx, o, p, b, filepath.Join(stage, "usr", "bin")); err != nil {
			return nil, err
		}
	}
	layerTar := filepath.Join(o.Out, "build", p.OS+"-"+p.Architecture+".layer.tar")
	if err := tarDir(ctx, stage, layerTar, o.Epoch, "etc", "usr"); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromFile(layerTar, tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Created = v1.Time{Time: o.Epoch}
	cf.Config = v1.Config{
		Entrypoint: []string{"/usr/bin/" + Binaries[0]},
		User:       User,
		WorkingDir: "/",
		Env:        []string{"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
		Labels: map[string]string{
			"org.opencontainers.image.title":   "nodeproof",
			"org.opencontainers.image.version": o.Version,
			"org.opencontainers.image.source":  "https://github.com/nodeproof/nodeproof",
		},
	}
	return mutate.ConfigFile(img, cf)
}

// goBuild builds cmd/name for p into dir, static and reproducible.
func goBuild(ctx context.Context, o Options, p v1.Platform, name, dir string) error {
	out, err := filepath.Abs(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	ldflags := "-s -w -buildid= -X github.com/nodeproof/nodeproof/cmd/nodeproof/cli.Version=" + o.Version
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", out, "./cmd/"+name)
	cmd.Dir = o.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/%s: %w\n%s", name, err, msg)
	}
	return nil
}

// tarDir archives entries of dir with GNU tar, reproducibly: names
// sorted, owned by root, every time epoch, modes as staged but never
// group- or world-writable, no atime or ctime.
func tarDir(ctx context.Context, dir, archive string, epoch time.Time, entries ...string) error {
	args := []string{"--sort=name", "--mtime=@" + strconv.FormatInt(epoch.Unix(), 10),
		"--owner=0", "--group=0", "--numeric-owner", "--mode=go-w", "--format=posix",
		"--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
		"-C", dir, "-cf", archive}
	cmd := exec.CommandContext(ctx, "tar", append(args, entries...)...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("tar: %w\n%s", err, msg)
	}
	return nil
}

// gitVersion is `git describe` of the checkout and its commit's time.
func gitVersion(ctx context.Context, root string) (string, time.Time, error) {
	out, err := exec.CommandContext(ctx, "git", "-C", root, "describe", "--always", "--dirty", "--tags").Output()
	if err != nil {
		return "", time.Time{}, fmt.Errorf("git describe (give -version): %w", err)
	}
	ts, err := exec.CommandContext(ctx, "git", "-C", root, "log", "-1", "--format=%ct").Output()
	if err != nil {
		return "", time.Time{}, fmt.Errorf("git log: %w", err)
	}
	sec, err := strconv.ParseInt(strings.TrimSpace(string(ts)), 10, 64)
	if err != nil {
		return "", time.Time{}, errors.New("git log: no commit time")
	}
	return strings.TrimSpace(string(out)), time.Unix(sec, 0).UTC(), nil
}
