package local

import (
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// kernelPATH is the PATH every workload gets; the runner's own PATH never
// leaks (contract 10.6).
const kernelPATH = "/usr/local/bin:/usr/bin:/bin"

// kernelArgv is the kernel command line of a run-session app: flags before
// the entry path (contract 10.1, later-revision order). inspectPort 0 means
// no inspection endpoint.
func kernelArgv(prefix []string, entry string, inspectPort int) []string {
	argv := slices.Concat(prefix, []string{"run"})
	if inspectPort != 0 {
		argv = append(argv, "--inspect", net.JoinHostPort("127.0.0.1", strconv.Itoa(inspectPort)), "--no-open")
	}
	return append(argv, entry)
}

// watchArgv is the kernel command line of watch app i (contract 10.1, the
// later-revision order with the flags before the path): run --watch
// --inspect 127.0.0.1:<port> --no-open <entry>.
func watchArgv(prefix []string, entry string, inspectPort int) []string {
	return slices.Concat(prefix, []string{
		"run", "--watch",
		"--inspect", net.JoinHostPort("127.0.0.1", strconv.Itoa(inspectPort)),
		"--no-open", entry,
	})
}

// CanRun reports whether the local backend can run an app session or agent
// of image (see imageArgv).
func CanRun(image string) bool {
	_, err := imageArgv(image)
	return err == nil
}

// imageArgv turns a self-contained session's image into an argv. There are
// no images on this machine, so only "<absolute path to an executable>
// [args...]" can run.
func imageArgv(image string) ([]string, error) {
	argv := strings.Fields(image)
	if len(argv) > 0 && filepath.IsAbs(argv[0]) {
		if fi, err := os.Stat(argv[0]); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return argv, nil
		}
	}
	return nil, &backend.StartError{
		Stage:   "pull",
		Message: fmt.Sprintf("image %s cannot run on the local backend (give an absolute path to an executable)", image),
	}
}

// kernelEnv is the whole environment of an app process (contract 10.6):
// the session's shaped env plus HOME and PATH, FORCE_COLOR=1 in run
// sessions, CLICOLOR_FORCE=1 and TERM for tty apps. A watch app never gets
// TELO_CACHE_DIR (it would split the module cache per app, 9.7), and under
// `io: streams` no colour variable is added. The runner's variables win
// over a session variable of the same name. Entries exec cannot pass
// (empty names, '=' in a name, NUL anywhere) are dropped and returned.
func kernelEnv(spec map[string]string, home, mode string, tty bool) (env, dropped []string) {
	m := maps.Clone(spec)
	if m == nil {
		m = make(map[string]string)
	}
	m["HOME"] = home
	m["PATH"] = kernelPATH
	switch mode {
	case contract.ModeRun:
		m["FORCE_COLOR"] = "1"
	case contract.ModeWatch:
		delete(m, "TELO_CACHE_DIR")
	}
	if tty {
		m["CLICOLOR_FORCE"] = "1"
		m["TERM"] = "xterm-256color"
	}
	return envList(m)
}

// workspaceEnv is the whole environment of a watch session's workspace
// server: neither session nor operator env reaches it (contract 10.6).
func workspaceEnv(dir string, port int, home string) []string {
	return []string{
		"WORKSPACE_DIR=" + dir,
		"PORT=" + strconv.Itoa(port),
		"WORKSPACE_BIND=127.0.0.1",
		"PATH=" + kernelPATH,
		"HOME=" + home,
	}
}

// agentEnv is the whole environment of a watch session's agent: the
// operator (catalog) env plus WORKSPACE_DIR, CLICOLOR_FORCE=1, HOME and
// PATH — never the session env (contract 10.6, 11.4). Unpassable entries
// are dropped and returned as by kernelEnv.
func agentEnv(operator map[string]string, workspace, home string) (env, dropped []string) {
	m := maps.Clone(operator)
	if m == nil {
		m = make(map[string]string)
	}
	m["WORKSPACE_DIR"] = workspace
	m["CLICOLOR_FORCE"] = "1"
	m["HOME"] = home
	m["PATH"] = kernelPATH
	return envList(m)
}

// envList turns m into exec's "NAME=value" form, sorted by name. Entries
// exec cannot pass (empty names, '=' in a name, NUL anywhere) are dropped
// and their names returned.
func envList(m map[string]string) (env, dropped []string) {
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			dropped = append(dropped, k)
			continue
		}
		env = append(env, k+"="+v)
	}
	return env, dropped
}

// freeLoopbackPort returns a tcp port that was free on 127.0.0.1 a moment
// ago. The kernel binds it later; a race with another process makes the
// kernel fail its inspection endpoint, which the run reports.
func freeLoopbackPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick loopback port: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		return 0, fmt.Errorf("pick loopback port: %w", err)
	}
	return port, nil
}
