//go:build tools

// Package tools pins the binaries hack/tools.sh builds from this module.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
