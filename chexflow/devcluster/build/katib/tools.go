//go:build tools

// Package tools names the Katib programs build.sh builds, so that `go mod tidy` keeps every
// module they need in go.mod and go.sum (the tools build tag keeps this file out of builds).
package tools

import (
	_ "github.com/kubeflow/katib/cmd/db-manager/v1beta1"
	_ "github.com/kubeflow/katib/cmd/katib-controller/v1beta1"
	_ "github.com/kubeflow/katib/cmd/metricscollector/v1beta1/file-metricscollector"
	_ "github.com/kubeflow/katib/cmd/suggestion/goptuna/v1beta1"
)
