//go:build linux

package kubetest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// BinEnv is the environment variable naming the directory that holds
// etcd, kube-apiserver, kube-controller-manager and standin-kubelet.
const BinEnv = "TELORUNNER_KUBE_BIN"

// bins returns the paths of the named binaries in $TELORUNNER_KUBE_BIN and
// fails the test, naming every missing one, when any is absent.
func bins(t testing.TB, names ...string) map[string]string {
	t.Helper()
	dir := os.Getenv(BinEnv)
	if dir == "" {
		t.Fatalf("kubetest: %s is not set; it names the directory holding %s. "+
			"Run the tests with `make test`, or run `make kube-bins` and set %s to the directory it prints",
			BinEnv, strings.Join(names, ", "), BinEnv)
	}
	paths := make(map[string]string, len(names))
	var missing []string
	for _, n := range names {
		p := filepath.Join(dir, n)
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, p)
			continue
		}
		paths[n] = p
	}
	if len(missing) > 0 {
		t.Fatalf("kubetest: missing binaries: %s (%s=%s); `make kube-bins` builds them",
			strings.Join(missing, ", "), BinEnv, dir)
	}
	return paths
}
