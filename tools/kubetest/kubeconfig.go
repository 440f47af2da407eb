//go:build linux

package kubetest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
)

// KubeconfigPath writes a kubeconfig file for cfg (server, CA and bearer
// token; default namespace Namespace) into the Env's directory and returns
// its path, for processes the test starts. One file per token; it is
// removed with the Env. Call it from the test goroutine: it fails the test
// on error.
func (e *Env) KubeconfigPath(cfg *rest.Config) string {
	e.t.Helper()
	path, err := e.writeKubeconfig(cfg)
	if err != nil {
		e.t.Fatalf("kubetest: %v", err)
	}
	return path
}

func (e *Env) writeKubeconfig(cfg *rest.Config) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p, ok := e.kubeconf[cfg.BearerToken]; ok {
		return p, nil
	}
	b, err := json.MarshalIndent(kubeconfig(cfg, e.Namespace), "", "  ")
	if err != nil {
		return "", fmt.Errorf("encode kubeconfig: %w", err)
	}
	path := filepath.Join(e.dir, fmt.Sprintf("kubeconfig-%d", len(e.kubeconf)))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return "", fmt.Errorf("write kubeconfig: %w", err)
	}
	e.kubeconf[cfg.BearerToken] = path
	return path, nil
}

// kubeconfig is the kubeconfig (v1, JSON is valid YAML) for one token.
// Written by hand to keep client-go's clientcmd, and its dependencies, out of
// the module.
func kubeconfig(cfg *rest.Config, namespace string) map[string]any {
	named := func(name string, key string, v map[string]any) []map[string]any {
		return []map[string]any{{"name": name, key: v}}
	}
	return map[string]any{
		"apiVersion":      "v1",
		"kind":            "Config",
		"current-context": "kubetest",
		// []byte marshals as base64, which is what the *-data fields hold.
		"clusters": named("kubetest", "cluster", map[string]any{"server": cfg.Host, "certificate-authority-data": cfg.CAData}),
		"users":    named("kubetest", "user", map[string]any{"token": cfg.BearerToken}),
		"contexts": named("kubetest", "context", map[string]any{"cluster": "kubetest", "user": "kubetest", "namespace": namespace}),
	}
}
