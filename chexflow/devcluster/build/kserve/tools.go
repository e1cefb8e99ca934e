//go:build tools

// Package tools names the program build.sh builds (KServe's controller manager), so that
// `go mod tidy` keeps every module it needs in go.mod and go.sum (the tools build tag keeps this
// file out of builds).
package tools

import (
	_ "github.com/kserve/kserve/cmd/manager"
)
