// The OCI registry of the local cluster: distribution's registry command (RootCmd: `registry
// serve CONFIG`) with the only parts the local cluster configures, htpasswd auth and the
// filesystem storage driver. Upstream's cmd/registry/main.go also links the S3, GCS and Azure
// drivers, the token auth and the pull-through proxy: twice the binary and the cold build.
//
// `registry hash-password` prints the bcrypt hash of the password on stdin for its htpasswd
// file (the hash the htpasswd auth checks, with the same library), so nothing else is needed
// to write one.
package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	"golang.org/x/crypto/bcrypt"
)

func hashPassword() int {
	password, err := io.ReadAll(os.Stdin)
	if err == nil {
		var hash []byte
		hash, err = bcrypt.GenerateFromPassword(
			[]byte(strings.TrimRight(string(password), "\n")), bcrypt.DefaultCost)
		if err == nil {
			fmt.Println(string(hash))
			return 0
		}
	}
	fmt.Fprintln(os.Stderr, "registry hash-password:", err)
	return 1
}

func main() {
	if len(os.Args) == 2 && os.Args[1] == "hash-password" {
		os.Exit(hashPassword())
	}
	// RootCmd exits non-zero by itself when serving fails
	registry.RootCmd.Execute() //nolint:errcheck
}
