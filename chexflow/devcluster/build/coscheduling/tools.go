//go:build tools

// Package tools names the scheduler build.sh builds, so that `go mod tidy` keeps every module it
// needs in go.mod and go.sum (the tools build tag keeps this file out of builds).
package tools

import (
	_ "sigs.k8s.io/scheduler-plugins/cmd/controller"
	_ "sigs.k8s.io/scheduler-plugins/cmd/scheduler"
)
