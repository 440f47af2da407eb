package imagebuild

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// DockerConfig is a keychain read from a dockerconfigjson document (a
// kubernetes.io/dockerconfigjson Secret's .dockerconfigjson, or a
// ~/.docker/config.json): {"auths": {"<registry>": {"auth": base64(user:pass)}
// or {"username", "password"}}}. Keys may carry a scheme and path
// ("https://index.docker.io/v1/"); they match on host[:port]. A registry
// with no entry is anonymous.
type DockerConfig struct {
	auths map[string]authn.AuthConfig
}

var _ authn.Keychain = (*DockerConfig)(nil)

// ParseDockerConfig parses a dockerconfigjson document; empty data is an
// empty keychain.
func ParseDockerConfig(data []byte) (*DockerConfig, error) {
	c := &DockerConfig{auths: map[string]authn.AuthConfig{}}
	if len(strings.TrimSpace(string(data))) == 0 {
		return c, nil
	}
	var doc struct {
		Auths map[string]struct {
			Auth          string `json:"auth"`
			Username      string `json:"username"`
			Password      string `json:"password"`
			IdentityToken string `json:"identitytoken"`
		} `json:"auths"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("parse dockerconfigjson: %w", err)
	}
	for k, v := range doc.Auths {
		a := authn.AuthConfig{Username: v.Username, Password: v.Password, IdentityToken: v.IdentityToken}
		if v.Auth != "" {
			raw, err := base64.StdEncoding.DecodeString(v.Auth)
			if err != nil {
				return nil, fmt.Errorf("parse dockerconfigjson: auth of %s: %w", k, err)
			}
			user, pass, ok := strings.Cut(string(raw), ":")
			if !ok {
				return nil, fmt.Errorf("parse dockerconfigjson: auth of %s is not user:password", k)
			}
			a.Username, a.Password = user, pass
		}
		c.auths[registryHost(k)] = a
	}
	return c, nil
}

// registryHost is host[:port] of a dockerconfig key or URL.
func registryHost(k string) string {
	if u, err := url.Parse(k); err == nil && u.Host != "" {
		return u.Host
	}
	h, _, _ := strings.Cut(k, "/")
	return h
}

// Resolve implements authn.Keychain. Docker Hub's names (index.docker.io,
// docker.io, registry-1.docker.io) are one registry.
func (c *DockerConfig) Resolve(r authn.Resource) (authn.Authenticator, error) {
	host := r.RegistryStr()
	cands := []string{host}
	if host == name.DefaultRegistry || host == "docker.io" || host == "registry-1.docker.io" {
		cands = []string{"index.docker.io", "docker.io", "registry-1.docker.io"}
	}
	for _, h := range cands {
		if a, ok := c.auths[h]; ok {
			return authn.FromConfig(a), nil
		}
	}
	return authn.Anonymous, nil
}

// Registry addresses the run images of one repository: where they are
// pushed (Repository, RUNNER_IMAGE_REPOSITORY) and where the existence
// check asks (APIURL, RUNNER_REGISTRY_API_URL: its scheme and host replace
// the repository's registry, so an in-cluster name can be checked through
// another address).
type Registry struct {
	Repository string // host[:port]/path, no tag
	APIURL     string // "" = no existence check (always build)
	Insecure   bool   // RUNNER_REGISTRY_INSECURE: plain HTTP allowed
	// Timeout bounds one existence check (0: 10 s).
	Timeout time.Duration
}

// Ref is the run image of tag: <Repository>:<tag> (11.11 step 2).
func (r Registry) Ref(tag string) string { return strings.TrimSuffix(r.Repository, "/") + ":" + tag }

// checkRef is the reference the existence check asks for.
func (r Registry) checkRef(tag string) (name.Reference, error) {
	u, err := url.Parse(r.APIURL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("registry API URL %q has no host", r.APIURL)
	}
	repo := strings.TrimSuffix(r.Repository, "/")
	if ref, err := name.NewRepository(repo); err == nil {
		repo = ref.RepositoryStr()
	}
	var opts []name.Option
	if u.Scheme == "http" || r.Insecure {
		opts = append(opts, name.Insecure)
	}
	return name.NewTag(u.Host+"/"+repo+":"+tag, opts...)
}

// Exists reports whether the registry holds tag: a HEAD of its manifest
// with the OCI and Docker manifest Accept types, Basic auth from keys
// (nil: anonymous), a Bearer token exchange on a 401 challenge (ggcr's
// transport does both). Any error is false (contract 11.11 step 4), and
// so is an unset APIURL.
func (r Registry) Exists(ctx context.Context, tag string, keys authn.Keychain) bool {
	if r.APIURL == "" {
		return false
	}
	ref, err := r.checkRef(tag)
	if err != nil {
		return false
	}
	if keys == nil {
		keys = authn.NewMultiKeychain()
	}
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// The check authenticates as the push secret's entry for the
	// repository's own registry when the API URL's host has none.
	_, err = remote.Head(ref, remote.WithContext(ctx), remote.WithAuthFromKeychain(aliasKeychain{keys, r.Repository}))
	return err == nil
}

// aliasKeychain resolves a registry with no entry of its own as the
// repository's registry.
type aliasKeychain struct {
	keys authn.Keychain
	repo string
}

func (a aliasKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	au, err := a.keys.Resolve(r)
	if err != nil || au != authn.Anonymous {
		return au, err
	}
	repo, err := name.NewRepository(strings.TrimSuffix(a.repo, "/"))
	if err != nil {
		return authn.Anonymous, nil
	}
	return a.keys.Resolve(repo.Registry)
}
