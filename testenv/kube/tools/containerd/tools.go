//go:build tools

// Package tools pins the containerd 2.x the GPU test node runs (see ../../nodes.sh): unlike
// Debian's 1.6 it injects CDI devices, which the DRA kubelet plugin names for a pod.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
