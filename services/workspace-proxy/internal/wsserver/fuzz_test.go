package wsserver_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/workspace-proxy/internal/wsserver"
)

// FuzzApply sends a change set with one random write (path, content,
// encoding) and optionally one random delete. Whatever the input, the
// handler must not panic, must not create or modify anything outside the
// root, and a 2xx answer means the written bytes read back at the
// normalized path.
func FuzzApply(f *testing.F) {
	for _, seed := range []struct{ path, content, encoding, del string }{
		{"telo.yaml", "kind: Application\n", "", ""},
		{"a/b/c.txt", "aGVsbG8=", "base64", ""},
		{"x", "not base64!", "base64", ""},
		{"x", "y", "hex", ""},
		{"../x", "escape", "utf8", ""},
		{"/etc/passwd", "root::0:0::/:/bin/sh\n", "", ""},
		{`a\..\..\x`, "b", "", ""},
		{"escape/pwned", "p", "", ""},
		{"escape/d/f", "p", "", "escape/d"},
		{"secretlink", "p", "", ""},
		{"dotdot/outside/secret", "p", "", "dotdot/outside"},
		{"inlink/new", "p", "", ""},
		{"ok", "p", "", "escape"},
		{"ok2", "p", "", "dotdot"},
		{"a\x00b", "p", "", ""},
		{"f", "\xff\xfe invalid utf8", "utf8", ""},
		{"d/e", "p", "", "d"},
		{strings.Repeat("n", 300), "p", "", ""},
	} {
		f.Add(seed.path, seed.content, seed.encoding, seed.del)
	}
	sb := newSandbox(f)
	srv, err := wsserver.New(wsserver.Options{Dir: sb.root})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = srv.Close() })
	before := sb.describe(f)

	f.Fuzz(func(t *testing.T, p, content, encoding, del string) {
		sb.restore(t)
		type op struct {
			Path     string `json:"path"`
			Content  string `json:"content"`
			Encoding string `json:"encoding,omitempty"`
		}
		cs := map[string]any{"write": []op{{p, content, encoding}}}
		if del != "" {
			cs["delete"] = []string{del}
		}
		body, err := json.Marshal(cs)
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/workspace", bytes.NewReader(body)))
		sb.assertUnchanged(t, before)

		// Judge by what the server saw: JSON turns invalid UTF-8 into U+FFFD.
		var sent struct {
			Write  []op
			Delete []string
		}
		if err := json.Unmarshal(body, &sent); err != nil {
			t.Fatal(err)
		}
		p, content, encoding = sent.Write[0].Path, sent.Write[0].Content, sent.Write[0].Encoding
		if del != "" {
			del = sent.Delete[0]
		}

		norm, pathErr := contract.NormalizePath(p)
		_, delErr := contract.NormalizePath(del)
		if pathErr != nil || (del != "" && delErr != nil) {
			if rec.Code != 400 {
				t.Fatalf("invalid path %q / %q answered %d %s, want 400", p, del, rec.Code, rec.Body)
			}
			return
		}
		if rec.Code/100 != 2 {
			if rec.Code != 400 && rec.Code != 500 {
				t.Fatalf("answered %d %s, want 2xx, 400 or 500", rec.Code, rec.Body)
			}
			return
		}
		want := []byte(content)
		switch encoding {
		case "", "utf8":
		case "base64":
			if want, err = base64.StdEncoding.DecodeString(content); err != nil {
				t.Fatalf("invalid base64 %q answered %d", content, rec.Code)
			}
		default:
			t.Fatalf("encoding %q answered %d, want 400", encoding, rec.Code)
		}
		if del != "" {
			if dn, _ := contract.NormalizePath(del); dn == norm || strings.HasPrefix(norm, dn+"/") {
				return // Deleted again after the write.
			}
		}
		rec = httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/workspace/file?encoding=base64&path="+url.QueryEscape(norm), nil))
		var file struct {
			Content string `json:"content"`
			Size    int    `json:"size"`
		}
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &file) != nil {
			t.Fatalf("read back %q = %d %s", norm, rec.Code, rec.Body)
		}
		if got, _ := base64.StdEncoding.DecodeString(file.Content); !bytes.Equal(got, want) || file.Size != len(want) {
			t.Fatalf("read back %q = %q (size %d), want %q", norm, got, file.Size, want)
		}
	})
}
