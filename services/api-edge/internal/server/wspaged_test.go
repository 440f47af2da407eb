package server

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"testing"
)

// streamed writes data through a contentWriter in pages of page bytes.
func streamed(t *testing.T, data []byte, page int, b64 bool) []byte {
	t.Helper()
	var out bytes.Buffer
	bw := bufio.NewWriter(&out)
	var w contentWriter = &textWriter{w: bw}
	if b64 {
		w = &b64Writer{enc: base64.NewEncoder(base64.StdEncoding, bw)}
	}
	for len(data) > 0 {
		n := min(page, len(data))
		if err := w.write(data[:n]); err != nil {
			t.Fatal(err)
		}
		data = data[n:]
	}
	if err := w.close(); err != nil {
		t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// A file streamed page by page is byte for byte what encoding the whole
// file at once gives (4.10): encoding/json's text of the string (invalid
// UTF-8 as U+FFFD, HTML characters escaped) or base64, wherever the page
// boundaries fall, runes and invalid sequences split across them included.
func FuzzContentWriter(f *testing.F) {
	for _, seed := range []string{
		"", "plain", "héllo wörld ✓ 𝄞 <a href=\"x\">&</a>\n\t\x00",
		"\xe2\x82", "\xe2\x82\xac", "\xf0\x9d\x84", "a\xf0\x41\x80b", "\xff\xfe\xfd", "\u2028\u2029",
	} {
		for page := 1; page <= 5; page++ {
			f.Add([]byte(seed), page)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, page int) {
		page = 1 + (page%4096+4096)%4096 // Any int names a page size of 1 to 4096.
		whole, _ := json.Marshal(string(data))
		if got := streamed(t, data, page, false); !bytes.Equal(got, whole[1:len(whole)-1]) {
			t.Fatalf("text of %q in pages of %d = %q, want %q", data, page, got, whole[1:len(whole)-1])
		}
		if got, want := streamed(t, data, page, true), base64.StdEncoding.EncodeToString(data); string(got) != want {
			t.Fatalf("base64 of %q in pages of %d = %q, want %q", data, page, got, want)
		}
	})
}
