package imagebuild

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

const user, pass = "pusher", "s3cret"

// authRegistry is an in-process OCI registry that wants Basic auth, or,
// with bearer, a token from its /token endpoint (which wants Basic auth).
func authRegistry(t *testing.T, bearer bool) *httptest.Server {
	t.Helper()
	reg := registry.New()
	const token = "tok-123"
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		basicOK := ok && u == user && p == pass
		if r.URL.Path == "/token" {
			if !basicOK {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			fmt.Fprintf(w, `{"token":%q}`, token)
			return
		}
		switch {
		case bearer && r.Header.Get("Authorization") == "Bearer "+token:
		case !bearer && basicOK:
		default:
			if bearer {
				w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="%s/token",service="test"`, srv.URL))
			} else {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			}
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func dockerConfig(host, u, p string) []byte {
	return fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, host, base64.StdEncoding.EncodeToString([]byte(u+":"+p)))
}

func TestExists(t *testing.T) {
	for _, bearer := range []bool{false, true} {
		t.Run(fmt.Sprintf("bearer=%v", bearer), func(t *testing.T) {
			srv := authRegistry(t, bearer)
			host := strings.TrimPrefix(srv.URL, "http://")
			keys, err := ParseDockerConfig(dockerConfig(host, user, pass))
			if err != nil {
				t.Fatal(err)
			}
			img, err := random.Image(64, 1)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := name.ParseReference(host+"/telo/apps:present", name.Insecure)
			if err != nil {
				t.Fatal(err)
			}
			if err := remote.Write(ref, img, remote.WithAuthFromKeychain(keys)); err != nil {
				t.Fatal(err)
			}
			r := Registry{Repository: host + "/telo/apps", APIURL: srv.URL}
			ctx := context.Background()
			if !r.Exists(ctx, "present", keys) {
				t.Fatal("pushed tag reported absent")
			}
			if r.Exists(ctx, "absent", keys) {
				t.Fatal("missing tag reported present")
			}
			bad, _ := ParseDockerConfig(dockerConfig(host, user, "wrong"))
			if r.Exists(ctx, "present", bad) {
				t.Fatal("wrong credentials reported present (an error must be absent)")
			}
			if r.Exists(ctx, "present", nil) {
				t.Fatal("anonymous check reported present on an authenticated registry")
			}
			// The repository names the registry by another host (its
			// in-cluster name): the API URL is asked, with that host's
			// credentials.
			alias := Registry{Repository: "registry.internal:5000/telo/apps", APIURL: srv.URL}
			aliasKeys, _ := ParseDockerConfig(dockerConfig("registry.internal:5000", user, pass))
			if !alias.Exists(ctx, "present", aliasKeys) {
				t.Fatal("check through the API URL with the repository host's credentials failed")
			}
			if (Registry{Repository: host + "/telo/apps"}).Exists(ctx, "present", keys) {
				t.Fatal("no API URL must mean absent (always build)")
			}
		})
	}
}

func TestParseDockerConfig(t *testing.T) {
	c, err := ParseDockerConfig([]byte(`{"auths":{"https://index.docker.io/v1/":{"username":"u","password":"p"},"r.example:5000":{"auth":"` +
		base64.StdEncoding.EncodeToString([]byte("a:b:c")) + `"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ repo, user, pass string }{
		{"telorun/node", "u", "p"},
		{"r.example:5000/x/y", "a", "b:c"},
		{"other.example/x", "", ""},
	} {
		repo, err := name.NewRepository(tc.repo)
		if err != nil {
			t.Fatal(err)
		}
		a, err := c.Resolve(repo.Registry)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := authn.Authorization(context.Background(), a)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Username != tc.user || cfg.Password != tc.pass {
			t.Errorf("%s: got %q/%q, want %q/%q", tc.repo, cfg.Username, cfg.Password, tc.user, tc.pass)
		}
	}
	if _, err := ParseDockerConfig([]byte(`{"auths":{"x":{"auth":"bm9jb2xvbg=="}}}`)); err == nil {
		t.Error("auth without a colon accepted")
	}
}
