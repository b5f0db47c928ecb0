//go:build tools

// Package tools pins the promtool CLI built by testenv/kube/cluster.sh (the chart's
// PrometheusRule is checked and unit-tested with it).
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
