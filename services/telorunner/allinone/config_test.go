package allinone

import "testing"

// The base-image menu is the Kubernetes backend's: the local backend runs
// no images, so the all-in-one turns it off there whatever the variable.
func TestBaseImageMenuOnlyOnKubernetes(t *testing.T) {
	for _, tt := range []struct {
		vars map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"RUNNER_BASE_IMAGE_CATALOG_ENABLED": "true"}, false},
		{map[string]string{"RUNNER_BACKEND": "kubernetes"}, true},
		{map[string]string{"RUNNER_BACKEND": "kubernetes", "RUNNER_BASE_IMAGE_CATALOG_ENABLED": "false"}, false},
	} {
		tt.vars["RUNNER_DATA_DIR"] = t.TempDir()
		cfg, err := LoadConfig(func(k string) (string, bool) { v, ok := tt.vars[k]; return v, ok })
		if err != nil {
			t.Fatalf("LoadConfig(%v) = %v", tt.vars, err)
		}
		if got := cfg.Edge.BaseImages.Enabled; got != tt.want {
			t.Errorf("LoadConfig(%v).Edge.BaseImages.Enabled = %v, want %v", tt.vars, got, tt.want)
		}
	}
}
