// Package dirsource is the directory mode's config source (`nodeproof
// serve --server-basedir`): an MCO bootstrap directory and a bootstrap
// kubeconfig file, rendered with mcs/render and served by an mcs.Server,
// re-read whenever a file (or the CA bundle the public tier carries)
// changes. Inputs that do not load leave the previous ones served.
package dirsource

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/render"
	"github.com/nodeproof/nodeproof/reload"
)

// Options configure a Source.
type Options struct {
	// Dir is the bootstrap directory (render.LoadBootstrapDir). Required.
	Dir string
	// Kubeconfig is the file the full tier carries at
	// /etc/kubernetes/kubeconfig; empty: the full tier cannot be served.
	Kubeconfig string
	// CABundle returns the CA bundle the public tier carries
	// (render.CABundleExtra); nil or empty: none.
	CABundle func() ([]byte, error)
	// Reload is how often the files are checked for changes (default 10 s).
	Reload time.Duration
	// Log receives reloads and failures. Required.
	Log *slog.Logger
}

// Source serves a directory: an mcs.Source.
type Source struct {
	o     Options
	stamp string // fingerprint of what was loaded last
}

var _ mcs.Source = (*Source)(nil)

// New checks o; nothing is read until First.
func New(o Options) (*Source, error) {
	if o.Dir == "" || o.Log == nil {
		return nil, errors.New("dirsource: Dir and Log are required")
	}
	if o.Reload <= 0 {
		o.Reload = 10 * time.Second
	}
	if o.CABundle == nil {
		o.CABundle = func() ([]byte, error) { return nil, nil }
	}
	return &Source{o: o}, nil
}

// String names the directory.
func (s *Source) String() string { return s.o.Dir }

// Bootstrap is nil: the directory's kubeconfig is shared by every node.
func (s *Source) Bootstrap() mcs.BootstrapTokens { return nil }

// First loads and renders the directory: an error if it does not load.
func (s *Source) First() (mcs.Configs, error) { return s.Load() }

// Run checks the directory every Options.Reload and serves what changed
// on srv, until ctx ends; inputs that do not load leave the previous ones
// served (and are logged).
func (s *Source) Run(ctx context.Context, srv *mcs.Server) {
	reload.Every(ctx, s.o.Reload, func(context.Context) {
		if changed, err := s.changed(); err != nil {
			s.o.Log.Error("inputs", "err", err.Error())
		} else if changed {
			if rendered, err := s.Load(); err != nil {
				s.o.Log.Error("inputs changed but do not load; still serving the previous ones", "err", err.Error())
			} else {
				srv.SetConfigs(rendered)
				s.o.Log.Info("inputs reloaded", "pools", strings.Join(rendered.Pools(), ","))
			}
		}
	})
}

func (s *Source) fingerprint() (string, error) {
	var b strings.Builder
	err := filepath.WalkDir(s.o.Dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if info, err := e.Info(); err == nil {
			fmt.Fprintf(&b, "%s %d %d\n", p, info.Size(), info.ModTime().UnixNano())
		}
		return nil
	})
	if info, err2 := os.Stat(s.o.Kubeconfig); err2 == nil {
		fmt.Fprintf(&b, "%s %d %d\n", s.o.Kubeconfig, info.Size(), info.ModTime().UnixNano())
	}
	// The public tier carries the CA bundle: a rotated one is a change.
	if ca, err2 := s.o.CABundle(); err2 == nil {
		fmt.Fprintf(&b, "ca-bundle %x\n", sha256.Sum256(ca))
	}
	return b.String(), err
}

func (s *Source) changed() (bool, error) {
	f, err := s.fingerprint()
	return err == nil && f != s.stamp, err
}

// Load reads and renders the directory now. A pool whose rendered config
// lists a MachineConfig the directory lacks is an error (a directory does
// not fill in later; serving would hand out a public tier without that
// config's files), as is any config that does not render.
func (s *Source) Load() (mcs.Rendered, error) {
	stamp, err := s.fingerprint()
	if err != nil {
		return mcs.Rendered{}, fmt.Errorf("read %s: %w", s.o.Dir, err)
	}
	in, err := render.LoadBootstrapDir(s.o.Dir)
	if err != nil {
		return mcs.Rendered{}, err
	}
	var kc []byte
	if s.o.Kubeconfig != "" {
		if kc, err = os.ReadFile(s.o.Kubeconfig); err != nil {
			return mcs.Rendered{}, fmt.Errorf("bootstrap kubeconfig: %w", err)
		}
	}
	ca, err := s.o.CABundle()
	if err != nil {
		return mcs.Rendered{}, err
	}
	extra, err := render.CABundleExtra(ca)
	if err != nil {
		return mcs.Rendered{}, err
	}
	r, err := render.NewRenderer(in, render.Options{BootstrapKubeconfig: kc, PublicExtra: extra})
	if err != nil {
		return mcs.Rendered{}, err
	}
	for _, pool := range r.Pools() {
		if missing, _ := r.Missing(pool); len(missing) > 0 {
			return mcs.Rendered{}, fmt.Errorf("render: pool %s lacks %s in %s", pool, strings.Join(missing, ", "), s.o.Dir)
		}
	}
	if err := r.Prerender(); err != nil {
		return mcs.Rendered{}, fmt.Errorf("render: %w", err)
	}
	s.stamp = stamp
	return mcs.Rendered{R: r}, nil
}
