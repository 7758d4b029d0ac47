//go:build tools

// Package tools pins the binaries hack/tools.sh builds from this module.
package tools

import (
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
