//go:build tools

// Package tools pins the helm CLI built by testenv/kube/cluster.sh (chart lint and tests).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
