package allinone

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseSync(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Sync
		wantErr bool
	}{
		{in: "", want: Sync{}},
		{in: "always", want: Sync{Always: true}},
		{in: "10s", want: Sync{Interval: 10 * time.Second}},
		{in: "2m", want: Sync{Interval: 2 * time.Minute}},
		{in: "0s", wantErr: true},
		{in: "-1m", wantErr: true},
		{in: "sometimes", wantErr: true},
		{in: "10", wantErr: true},
	} {
		got, err := ParseSync(tc.in)
		if tc.wantErr {
			if err == nil || !strings.HasPrefix(err.Error(), "RUNNER_NATS_SYNC:") {
				t.Errorf("ParseSync(%q) = %v, want an error naming RUNNER_NATS_SYNC", tc.in, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseSync(%q) = %+v, %v, want %+v", tc.in, got, err, tc.want)
		}
	}
}

// The all-in-one reads replicas through bus.LoadLimits and hands the sync
// setting to the embedded server, which reports it back.
func TestEmbeddedServerSyncAndLimits(t *testing.T) {
	vars := map[string]string{"RUNNER_NATS_REPLICAS": "3", "RUNNER_NATS_SYNC": "always", "RUNNER_OWNER_TTL_MS": "5000"}
	cfg, err := LoadConfig(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	if err != nil {
		t.Fatalf("LoadConfig() = %v", err)
	}
	if cfg.Limits.Replicas != 3 || cfg.Limits.OwnerTTL != 5*time.Second || !cfg.Sync.Always {
		t.Fatalf("LoadConfig() limits %+v sync %+v, want replicas 3, owner TTL 5s, sync always", cfg.Limits, cfg.Sync)
	}
	vars["RUNNER_NATS_REPLICAS"] = "9"
	if _, err := LoadConfig(func(k string) (string, bool) { v, ok := vars[k]; return v, ok }); err == nil || !strings.HasPrefix(err.Error(), "RUNNER_NATS_REPLICAS:") {
		t.Fatalf("LoadConfig(replicas 9) = %v, want an error naming RUNNER_NATS_REPLICAS", err)
	}
	for _, tc := range []struct {
		sync         Sync
		wantInterval time.Duration
		wantAlways   bool
	}{
		{Sync{}, 2 * time.Minute, false},
		{Sync{Interval: 10 * time.Second}, 10 * time.Second, false},
		{Sync{Always: true}, 2 * time.Minute, true},
	} {
		dir := t.TempDir()
		s, err := startNATS(filepath.Join(dir, "nats"), CredentialsDir(dir), -1, tc.sync)
		if err != nil {
			t.Fatal(err)
		}
		js := s.JetStreamConfig()
		s.Shutdown()
		s.WaitForShutdown()
		if js == nil || js.SyncInterval != tc.wantInterval || js.SyncAlways != tc.wantAlways {
			t.Errorf("startNATS(%v) JetStreamConfig = %+v, want interval %v always %v", tc.sync, js, tc.wantInterval, tc.wantAlways)
		}
	}
}
