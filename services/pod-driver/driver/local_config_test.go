package driver

import (
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/local"
)

func TestLocalConfig(t *testing.T) {
	lookup := func(vars map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	}
	c, err := LoadConfig(lookup(map[string]string{"RUNNER_DATA_DIR": "/srv/telo"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Local.SandboxOff || c.Local.Nice != local.DefaultSandboxNice || c.Local.Run != local.DefaultRunCeilings || c.Local.App != local.DefaultAppCeilings ||
		c.Local.Watch != local.DefaultWatchCeilings || c.Local.DataDir != "/srv/telo" {
		t.Errorf("defaults = %+v", c.Local)
	}
	c, err = LoadConfig(lookup(map[string]string{
		"RUNNER_LOCAL_SANDBOX": "off", "RUNNER_SANDBOX_UID": "4000", "RUNNER_SANDBOX_GID": "4001",
		"RUNNER_SANDBOX_MAX_PROCS": "64", "RUNNER_SANDBOX_MAX_FILES": "512", "RUNNER_SANDBOX_NICE": "0",
		"RUNNER_MAX_MEMORY": "64Mi", "RUNNER_MAX_TTL_SECONDS": "60", "RUNNER_MAX_EPHEMERAL_STORAGE": "1G",
		"RUNNER_APP_MAX_MEMORY": "1Gi", "RUNNER_WATCH_MAX_TTL_SECONDS": "120",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := LocalConfig{SandboxOff: true, SandboxUID: 4000, SandboxGID: 4001, MaxProcs: 64, MaxFiles: 512, Nice: 0,
		Run:     local.Ceilings{TTL: time.Minute, MemoryBytes: 64 << 20, TmpBytes: 1e9},
		App:     local.Ceilings{TTL: local.DefaultAppCeilings.TTL, MemoryBytes: 1 << 30, TmpBytes: local.DefaultAppCeilings.TmpBytes},
		Watch:   local.Ceilings{TTL: 2 * time.Minute, MemoryBytes: 1 << 30, TmpBytes: local.DefaultAppCeilings.TmpBytes},
		DataDir: c.Local.DataDir,
	}
	if c.Local != want {
		t.Errorf("Local = %+v\nwant %+v", c.Local, want)
	}
	for _, tc := range []struct{ name, v, want string }{
		{"RUNNER_LOCAL_SANDBOX", "maybe", "RUNNER_LOCAL_SANDBOX"},
		{"RUNNER_SANDBOX_UID", "0", "RUNNER_SANDBOX_UID"},
		{"RUNNER_SANDBOX_NICE", "20", "RUNNER_SANDBOX_NICE"},
		{"RUNNER_MAX_MEMORY", "lots", "RUNNER_MAX_MEMORY"},
		{"RUNNER_MAX_MEMORY", "-1Mi", "RUNNER_MAX_MEMORY"},
		{"RUNNER_WATCH_MAX_TTL_SECONDS", "0", "RUNNER_WATCH_MAX_TTL_SECONDS"},
	} {
		if _, err := LoadConfig(lookup(map[string]string{tc.name: tc.v})); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%q: error %v, want one naming %s", tc.name, tc.v, err, tc.want)
		}
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"100Mi": 100 << 20, "1Gi": 1 << 30, "512Ki": 512 << 10, "1M": 1e6, "2k": 2000, "5K": 5000, "4096": 4096, "1T": 1e12} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "Mi", "1.5Gi", "0", "-1", "1Xi", "9999999999Ti"} {
		if got, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) = %d, want an error", in, got)
		}
	}
}
