// Package version is the build's identity, stamped by the linker
// (`make images`, tools/images: -X …/version.Version=… and .Revision=…),
// and the `version` subcommand every binary answers.
package version

import (
	"fmt"
	"io"
	"os"
	"runtime"
)

// Version and Revision are set with -ldflags -X at build time; a plain
// `go build` leaves "dev" and "".
var (
	Version  = "dev"
	Revision = ""
)

// String is "<name> <version> (<revision>, <go version>)".
func String(name string) string {
	rev := Revision
	if rev == "" {
		rev = "unknown revision"
	}
	return fmt.Sprintf("%s %s (%s, %s)", name, Version, rev, runtime.Version())
}

// Requested reports whether args (os.Args[1:]) ask for the version: exactly
// `version`, `-version` or `--version`.
func Requested(args []string) bool {
	if len(args) != 1 {
		return false
	}
	switch args[0] {
	case "version", "-version", "--version":
		return true
	}
	return false
}

// Print writes String(name) and a newline to w.
func Print(w io.Writer, name string) {
	fmt.Fprintln(w, String(name))
}

// Handled prints name's version to standard output and reports true when
// the command line asks for it (Requested): a main then returns.
func Handled(name string) bool {
	if !Requested(os.Args[1:]) {
		return false
	}
	Print(os.Stdout, name)
	return true
}
