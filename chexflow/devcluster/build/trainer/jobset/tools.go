//go:build tools

// Package tools names the program ../build.sh builds here (JobSet's controller, the package at
// its module root), so that `go mod tidy` keeps every module it needs in go.mod and go.sum.
package tools

import (
	_ "sigs.k8s.io/jobset"
)
