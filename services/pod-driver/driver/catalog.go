package driver

import (
	"encoding/json"
	"fmt"
)

// parseOperatorEnv reads the env of each RUNNER_APPS entry (contract 12.1;
// the edge validates the rest of the catalog). The driver adds it to an
// agent or an operator app session at start, so catalog secrets are never
// stored on the bus.
func parseOperatorEnv(raw string) (map[string]map[string]string, error) {
	var entries map[string]struct {
		Env map[string]string `json:"env"`
	}
	if err := json.Unmarshal([]byte(raw), &entries); err != nil {
		return nil, fmt.Errorf("RUNNER_APPS: %w", err)
	}
	out := make(map[string]map[string]string, len(entries))
	for name, e := range entries {
		if e.Env == nil {
			e.Env = map[string]string{}
		}
		out[name] = e.Env
	}
	return out, nil
}
