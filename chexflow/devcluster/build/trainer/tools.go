//go:build tools

// Package tools names the programs build.sh builds (Trainer's controller manager and JobSet's
// controller, the package at JobSet's module root), so that `go mod tidy` keeps every module
// they need in go.mod and go.sum (the tools build tag keeps this file out of builds).
package tools

import (
	_ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
	_ "sigs.k8s.io/jobset"
)
