package devkernel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// InstallFailMarker in an entry file makes install fail (tests of a
// failed image build): 25 numbered lines on stderr, exit 1.
const InstallFailMarker = "devkernel-install: fail"

// InstallHangMarker in an entry file makes install never finish (tests
// of a build that runs out of time): it waits to be killed.
const InstallHangMarker = "devkernel-install: hang"

// InstallFile is what install writes under $TELO_CACHE_DIR.
const InstallFile = "devkernel/installed.txt"

// Install is `telo install <path>` (the image build's dependency step):
// it reads the entry manifest and writes InstallFile under
// $TELO_CACHE_DIR, deterministic for the same manifest: its name and the
// SHA-256 of its bytes. Exit 2 on usage errors, 1 on failure.
func Install(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var path string
	for _, a := range args {
		switch {
		case a == "--no-cache-write" || a == "--debug":
		case strings.HasPrefix(a, "-"):
			fmt.Fprintf(stderr, "devkernel install: unknown flag %s\n", a)
			return 2
		case path == "":
			path = a
		default:
			fmt.Fprintf(stderr, "devkernel install: unexpected argument %s\n", a)
			return 2
		}
	}
	if path == "" {
		fmt.Fprintln(stderr, "devkernel install: missing manifest path")
		return 2
	}
	cache := os.Getenv("TELO_CACHE_DIR")
	if cache == "" {
		fmt.Fprintln(stderr, "devkernel install: TELO_CACHE_DIR is not set")
		return 2
	}
	entry := EntryFile(path)
	data, err := os.ReadFile(entry)
	if err != nil {
		fmt.Fprintf(stderr, "devkernel install: %v\n", err)
		return 1
	}
	if strings.Contains(string(data), InstallFailMarker) {
		for i := 1; i <= 25; i++ {
			fmt.Fprintf(stderr, "install error line %d\n", i)
		}
		return 1
	}
	if strings.Contains(string(data), InstallHangMarker) {
		fmt.Fprintln(stdout, "devkernel install: hanging until stopped")
		<-ctx.Done()
		return 143
	}
	sum := sha256.Sum256(data)
	out := filepath.Join(cache, InstallFile)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		fmt.Fprintf(stderr, "devkernel install: %v\n", err)
		return 1
	}
	body := fmt.Sprintf("installed %s sha256:%s\n", filepath.Base(entry), hex.EncodeToString(sum[:]))
	if err := os.WriteFile(out, []byte(body), 0o644); err != nil {
		fmt.Fprintf(stderr, "devkernel install: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "devkernel install: %s", body)
	return 0
}
