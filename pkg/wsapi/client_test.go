package wsapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve answers every request with h and records the last request line.
func serve(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return New(ts.URL+"/", ts.Client())
}

func TestErrorCarriesCode(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(404)
		_, _ = io.WriteString(w, `{"error":"file_not_found","message":"read a.yaml: no such file"}`)
	})
	_, err := c.Read(t.Context(), "a.yaml", EncodingBase64)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("Read() = %v, want *Error", err)
	}
	want := Error{Method: "GET", Path: "/workspace/file?encoding=base64&path=a.yaml", Status: 404,
		Code: "file_not_found", Message: "read a.yaml: no such file",
		Body: `{"error":"file_not_found","message":"read a.yaml: no such file"}`}
	if *e != want {
		t.Fatalf("Read() error = %+v, want %+v", *e, want)
	}
	if !IsNotFound(err) {
		t.Fatal("IsNotFound() = false, want true")
	}
}

func TestErrorBodyTruncated(t *testing.T) {
	long := strings.Repeat("é", 2000) // Multi-byte: the limit counts characters.
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(502)
		_, _ = io.WriteString(w, long)
	})
	_, err := c.Tree(t.Context())
	var e *Error
	if !errors.As(err, &e) || e.Status != 502 || e.Code != "" || IsNotFound(err) {
		t.Fatalf("Tree() = %v, want a 502 *Error without code", err)
	}
	if n := utf8.RuneCountInString(e.Body); n != 500 || !strings.HasPrefix(long, e.Body) {
		t.Fatalf("Error.Body has %d characters, want the first 500", n)
	}
}

func TestRequestShapes(t *testing.T) {
	var got []string
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.RequestURI()+" "+string(body))
		switch r.URL.Path {
		case "/workspace":
			if r.Method == "POST" {
				_, _ = io.WriteString(w, `{"written":1,"deleted":1}`)
				return
			}
			_, _ = io.WriteString(w, `{"files":[{"path":"a","hash":"h"}]}`)
		case "/workspace/touch":
			_, _ = io.WriteString(w, `{"touched":2}`)
		case "/workspace/snapshot":
			_, _ = io.WriteString(w, `{"files":[{"path":"a","hash":"h","content":"eA==","encoding":"base64"}]}`)
		default:
			_, _ = io.WriteString(w, `{}`)
		}
	})
	ctx := t.Context()
	if tr, err := c.Tree(ctx); err != nil || len(tr.Files) != 1 || tr.Files[0] != (TreeFile{Path: "a", Hash: "h"}) {
		t.Fatalf("Tree() = %+v, %v", tr, err)
	}
	if r, err := c.Apply(ctx, ChangeSet{Write: []WriteOp{{Path: "a", Content: "x"}}, Delete: []string{"b"}}); err != nil || r != (ApplyResult{Written: 1, Deleted: 1}) {
		t.Fatalf("Apply() = %+v, %v", r, err)
	}
	if n, err := c.Touch(ctx, []string{"a", "b"}); err != nil || n != 2 {
		t.Fatalf("Touch() = %d, %v", n, err)
	}
	if s, err := c.Snapshot(ctx); err != nil || len(s) != 1 || s[0] != (SnapshotFile{"a", "h", "eA==", "base64"}) {
		t.Fatalf("Snapshot() = %+v, %v", s, err)
	}
	if _, err := c.Read(ctx, "a b/c", ""); err != nil {
		t.Fatal(err)
	}
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"GET /workspace ",
		`POST /workspace {"write":[{"path":"a","content":"x"}],"delete":["b"]}`,
		`POST /workspace/touch {"paths":["a","b"]}`,
		"GET /workspace/snapshot ",
		"GET /workspace/file?path=a+b%2Fc ",
		"GET /healthz ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestBlobVerifiesHash(t *testing.T) {
	const helloHash = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/workspace/blob/"+helloHash {
			_, _ = io.WriteString(w, "wrong bytes")
			return
		}
		_, _ = io.WriteString(w, "hello")
	})
	if got, err := c.Blob(t.Context(), helloHash); err != nil || string(got) != "hello" {
		t.Fatalf("Blob() = %q, %v; want hello", got, err)
	}
	other := strings.Repeat("0", 64)
	if _, err := c.Blob(t.Context(), other); err == nil {
		t.Fatal("Blob() accepted bytes that do not match the hash")
	}
}

func TestTimeout(t *testing.T) {
	release := make(chan struct{})
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	c.timeout = 50 * time.Millisecond
	_, err := c.Tree(t.Context())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Tree() against a stuck server = %v, want deadline exceeded", err)
	}
	if New("http://x", nil).timeout != 30*time.Second {
		t.Fatal("default per-request timeout is not 30 s")
	}
}

func TestTransportError(t *testing.T) {
	ts := httptest.NewServer(http.NotFoundHandler())
	url := ts.URL
	ts.Close()
	err := New(url, nil).Health(t.Context())
	var e *Error
	if err == nil || errors.As(err, &e) {
		t.Fatalf("Health() on a closed port = %v, want a transport error", err)
	}
}
