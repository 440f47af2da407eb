package bus_test

import (
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
)

func lookup(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

func TestLoadLimits(t *testing.T) {
	for _, tc := range []struct {
		name    string
		vars    map[string]string
		want    bus.Limits
		wantErr string
	}{
		{name: "defaults", vars: nil, want: bus.Limits{}.Defaults()},
		{name: "production", vars: map[string]string{"RUNNER_NATS_REPLICAS": "3", "RUNNER_REPLAY_BUFFER_BYTES": "1000", "RUNNER_OWNER_TTL_MS": " 6000 "},
			want: func() bus.Limits {
				l := bus.Limits{}.Defaults()
				l.Replicas, l.ReplayBytes, l.OwnerTTL = 3, 1000, 6*time.Second
				return l
			}()},
		{name: "replicas 0", vars: map[string]string{"RUNNER_NATS_REPLICAS": "0"}, wantErr: "RUNNER_NATS_REPLICAS"},
		{name: "replicas 6", vars: map[string]string{"RUNNER_NATS_REPLICAS": "6"}, wantErr: "RUNNER_NATS_REPLICAS"},
		{name: "replicas word", vars: map[string]string{"RUNNER_NATS_REPLICAS": "three"}, wantErr: "RUNNER_NATS_REPLICAS"},
		{name: "replay negative", vars: map[string]string{"RUNNER_REPLAY_BUFFER_BYTES": "-1"}, wantErr: "RUNNER_REPLAY_BUFFER_BYTES"},
		{name: "owner ttl too short", vars: map[string]string{"RUNNER_OWNER_TTL_MS": "299"}, wantErr: "RUNNER_OWNER_TTL_MS"},
		{name: "owner ttl word", vars: map[string]string{"RUNNER_OWNER_TTL_MS": "15s"}, wantErr: "RUNNER_OWNER_TTL_MS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := bus.LoadLimits(lookup(tc.vars))
			if tc.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr+":") {
					t.Fatalf("LoadLimits() = %v, want an error naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("LoadLimits() = %+v, %v, want %+v", got, err, tc.want)
			}
		})
	}
}
