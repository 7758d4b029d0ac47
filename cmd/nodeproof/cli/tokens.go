package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/seal"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/mcs/tokens"
)

func cmdToken(_ context.Context, in *invocation) error {
	stdout := in.stdout
	fs := in.flags()
	var dir, kubeconfig, ns string
	stateDirFlag(fs, &dir)
	grace := fs.Duration("grace", 24*time.Hour, "how long the previous token stays valid after a rotation (serve's --token-grace)")
	kubeconfigFlag(fs, &kubeconfig)
	tokenNamespaceFlag(fs, &ns)
	if _, err := in.exactly(0); err != nil {
		return err
	}
	action := in.action
	switch action {
	case "", "show", "rotate":
	default:
		return fmt.Errorf("token: unknown action %q (show or rotate)", action)
	}
	// show is a view: it makes no token (and no Secret, no file); rotate
	// makes the first one.
	create := action == "rotate"
	var p *tokens.Provisioning
	var st tokens.Store
	if kubeconfig != "" {
		cfg, err := serve.RESTConfig(kubeconfig)
		if err != nil {
			return err
		}
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		st = &cluster.TokenSecret{Client: kc, Namespace: ns}
	} else {
		if create {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
		}
		st = tokens.FileStore(filepath.Join(dir, "tokens.json"))
	}
	p, err := tokens.Open(context.Background(), st, *grace, time.Now, create)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("no provisioning token yet (token show makes none): `nodeproof token rotate` makes the first, and so does nodeproof serve at start")
	case err != nil && kubeconfig != "":
		return fmt.Errorf("%w (is the server's --token-secret-namespace another? deploy/base keeps the token in nodeproof)", err)
	case err != nil:
		return err
	}
	if action == "rotate" {
		if err := p.Rotate(); err != nil {
			return err
		}
	}
	fmt.Fprintln(stdout, p.Current())
	return nil
}

func cmdKeys(_ context.Context, in *invocation) error {
	fs := in.flags()
	var dir string
	stateDirFlag(fs, &dir)
	var keysFile string
	keysFileFlag(fs, &keysFile)
	retain := fs.Duration("retain", seal.DefaultRetain, "keep an older key this long after it stopped sealing (after the new key took over); must exceed the longest config token and session life")
	activate := fs.Duration("activate-after", seal.DefaultActivateAfter, "the new key seals only after this delay (every replica must have reloaded the file by then); 0 for a single server")
	if _, err := in.exactly(0); err != nil {
		return err
	}
	if *retain < 0 || *activate < 0 {
		return in.usageError("--retain and --activate-after cannot be negative")
	}
	path := keysFile
	if path == "" {
		path = filepath.Join(dir, "keys.json")
	}
	return rotateKeys(in.stdout, path, *retain, *activate, time.Now)
}

// rotateKeys rotates the keyring at path and says what it kept, until
// when, and what it dropped.
func rotateKeys(stdout io.Writer, path string, retain, activate time.Duration, clock func() time.Time) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	k, err := seal.LoadOrCreate(path, clock)
	if err != nil {
		return err
	}
	rot, err := k.Rotate(retain, activate)
	if err != nil {
		return err
	}
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	fmt.Fprintf(stdout, "rotated %s; the new key %s seals from %s\n", path, rot.New.ID, ts(rot.New.SealsFrom))
	for _, st := range rot.Kept {
		fmt.Fprintf(stdout, "kept key %s (made %s): it seals until %s and opens what it sealed until %s\n",
			st.ID, ts(st.Created), ts(st.SealsUntil), ts(st.KeptUntil))
	}
	for _, st := range rot.Dropped {
		fmt.Fprintf(stdout, "dropped key %s (made %s): it stopped sealing at %s, more than --retain %s ago\n",
			st.ID, ts(st.Created), ts(st.SealsUntil), retain)
	}
	return nil
}
