package driver

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/telorunner/telorunner/pkg/envconf"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/local"
)

// LocalConfig is the local backend's sandbox and ceilings (issue 18).
type LocalConfig struct {
	// SandboxOff is RUNNER_LOCAL_SANDBOX=off: workloads run as plain host
	// processes. Default on.
	SandboxOff bool
	// SandboxUID and SandboxGID are RUNNER_SANDBOX_UID / RUNNER_SANDBOX_GID:
	// the host ids workloads run as when the runner is root (65534).
	SandboxUID, SandboxGID int
	// MaxProcs and MaxFiles are RUNNER_SANDBOX_MAX_PROCS (256) and
	// RUNNER_SANDBOX_MAX_FILES (4096), per workload process.
	MaxProcs, MaxFiles int
	// Nice is RUNNER_SANDBOX_NICE (10): the niceness of workload processes,
	// so the runner's own work comes first when workloads fill the CPUs.
	Nice int
	// Run, App and Watch are the ceilings of RUNNER_MAX_MEMORY /
	// _TTL_SECONDS / _EPHEMERAL_STORAGE, RUNNER_APP_MAX_* and
	// RUNNER_WATCH_MAX_TTL_SECONDS (contract 11.2, 18).
	Run, App, Watch local.Ceilings
	// DataDir is RUNNER_DATA_DIR, hidden from every sandbox.
	DataDir string
}

func loadLocalConfig(get func(string) string) (LocalConfig, error) {
	c := LocalConfig{Run: local.DefaultRunCeilings, App: local.DefaultAppCeilings, Watch: local.DefaultWatchCeilings, Nice: local.DefaultSandboxNice}
	switch v := strings.ToLower(get("RUNNER_LOCAL_SANDBOX")); v {
	case "", "on", "true", "1":
	case "off", "false", "0":
		c.SandboxOff = true
	default:
		return c, fmt.Errorf("RUNNER_LOCAL_SANDBOX: must be on or off, got %q", v)
	}
	e := envconf.NewGetenv(get)
	e.Int("RUNNER_SANDBOX_UID", 1, 1<<31-2, &c.SandboxUID)
	e.Int("RUNNER_SANDBOX_GID", 1, 1<<31-2, &c.SandboxGID)
	e.Int("RUNNER_SANDBOX_MAX_PROCS", 1, 1<<31-2, &c.MaxProcs)
	e.Int("RUNNER_SANDBOX_MAX_FILES", 16, 1<<31-2, &c.MaxFiles)
	e.Int("RUNNER_SANDBOX_NICE", 0, 19, &c.Nice)
	if err := e.Err(); err != nil {
		return c, err
	}
	for _, set := range []struct {
		prefix string
		dst    *local.Ceilings
	}{{"RUNNER_MAX_", &c.Run}, {"RUNNER_APP_MAX_", &c.App}} {
		if v := get(set.prefix + "MEMORY"); v != "" {
			n, err := parseBytes(v)
			if err != nil {
				return c, fmt.Errorf("%sMEMORY: %w", set.prefix, err)
			}
			set.dst.MemoryBytes = n
		}
		if v := get(set.prefix + "EPHEMERAL_STORAGE"); v != "" {
			n, err := parseBytes(v)
			if err != nil {
				return c, fmt.Errorf("%sEPHEMERAL_STORAGE: %w", set.prefix, err)
			}
			set.dst.TmpBytes = n
		}
		if e.Duration(set.prefix+"TTL_SECONDS", time.Second, 1, 1<<32, &set.dst.TTL); e.Err() != nil {
			return c, e.Err()
		}
	}
	// Watch sessions: the app ceilings per process, their own deadline.
	c.Watch.MemoryBytes, c.Watch.TmpBytes = c.App.MemoryBytes, c.App.TmpBytes
	if e.Duration("RUNNER_WATCH_MAX_TTL_SECONDS", time.Second, 1, 1<<32, &c.Watch.TTL); e.Err() != nil {
		return c, e.Err()
	}
	if d := get("RUNNER_DATA_DIR"); d != "" {
		abs, err := filepath.Abs(d)
		if err != nil {
			return c, fmt.Errorf("RUNNER_DATA_DIR: %w", err)
		}
		c.DataDir = abs
	}
	return c, nil
}

// parseBytes parses a memory or storage quantity (contract 11.2): bytes
// with an optional suffix Ki Mi Gi Ti (powers of 1024) or K k M G T
// (powers of 1000).
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
		{"K", 1e3}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}}
	num, mult := s, int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("must be a positive quantity of bytes (e.g. 100Mi), got %q", s)
	}
	return n * mult, nil
}

// localOptions are the sandbox and ceiling options of the local backend.
func (c LocalConfig) apply(o *local.Options) {
	o.Sandbox = local.SandboxOptions{Off: c.SandboxOff, UID: c.SandboxUID, GID: c.SandboxGID, MaxProcs: c.MaxProcs, MaxFiles: c.MaxFiles, Nice: c.Nice}
	if c.DataDir != "" {
		o.Sandbox.Hide = []string{c.DataDir}
	}
	o.RunCeilings, o.AppCeilings, o.WatchCeilings = c.Run, c.App, c.Watch
}

// LocalCanRun reports whether the local backend can run a catalog entry's
// image: only "<absolute path to an executable> [args...]" (there are no
// images on this machine).
func LocalCanRun(image string) bool { return local.CanRun(image) }
