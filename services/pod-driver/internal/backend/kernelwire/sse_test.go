package kernelwire

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// frames parses a whole stream and returns the frames in order.
func frames(t testing.TB, r io.Reader) []string {
	t.Helper()
	s := newSSEReader(r)
	var got []string
	for {
		f, _, err := s.next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("next() error = %v, want io.EOF at the end", err)
			}
			return got
		}
		got = append(got, string(f))
	}
}

func TestSSEReader(t *testing.T) {
	tests := []struct {
		name   string
		stream string
		want   []string
	}{
		{"one frame", "data: {\"a\":1}\n\n", []string{`{"a":1}`}},
		{"no space after colon", "data:{\"a\":1}\n\n", []string{`{"a":1}`}},
		{"all leading whitespace stripped", "data: \t  {\"a\":1}\n\n", []string{`{"a":1}`}},
		{"multi-line data joined with newline", "data: {\"a\":\ndata:   1}\n\n", []string{"{\"a\":\n1}"}},
		{"comments ignored", ": ping\n\ndata: {\"a\":1}\n: inline\n\n", []string{`{"a":1}`}},
		{"stray newlines tolerated", "\n\ndata: {\"a\":1}\n\n\n\ndata: {\"b\":2}\n\n\n", []string{`{"a":1}`, `{"b":2}`}},
		{"crlf lines", "data: {\"a\":1}\r\n\r\n", []string{`{"a":1}`}},
		{"unparseable skipped", "data: {nope\n\ndata: {\"b\":2}\n\n", []string{`{"b":2}`}},
		{"non-object skipped", "data: [1]\n\ndata: null\n\ndata: 3\n\ndata: {\"b\":2}\n\n", []string{`{"b":2}`}},
		{"other fields ignored", "event: x\nid: 7\ndata: {\"a\":1}\nretry: 5\n\n", []string{`{"a":1}`}},
		{"partial block at end discarded", "data: {\"a\":1}\n\ndata: {\"b\":2}\n", []string{`{"a":1}`}},
		{"empty stream", "", nil},
		{"data prefix must start the line", " data: {\"a\":1}\n\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := frames(t, strings.NewReader(tt.stream)); !slices.Equal(got, tt.want) {
				t.Errorf("frames = %q, want %q", got, tt.want)
			}
			// The same frames whatever the read sizes.
			if got := frames(t, iotest.OneByteReader(strings.NewReader(tt.stream))); !slices.Equal(got, tt.want) {
				t.Errorf("frames (one byte reads) = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSSEReaderTimestamp(t *testing.T) {
	s := newSSEReader(strings.NewReader(
		"data: {\"timestamp\":\"2026-01-02T03:04:05.678Z\"}\n\n" +
			"data: {\"timestamp\":5}\n\n" +
			"data: {}\n\n"))
	want := []time.Time{time.Date(2026, 1, 2, 3, 4, 5, 678e6, time.UTC), {}, {}}
	for i, w := range want {
		_, ts, err := s.next()
		if err != nil {
			t.Fatalf("next() #%d error = %v", i, err)
		}
		if !ts.Equal(w) {
			t.Errorf("next() #%d timestamp = %v, want %v", i, ts, w)
		}
	}
}

func TestSSEReaderLongLines(t *testing.T) {
	big := `{"line":"` + strings.Repeat("x", 200<<10) + `"}`
	tooBig := `{"line":"` + strings.Repeat("y", maxFrameBytes) + `"}`
	stream := "data: " + big + "\n\n" + "data: " + tooBig + "\n\n" + ": " + strings.Repeat("c", maxFrameBytes+1) + "\n\n" + "data: {\"ok\":1}\n\n"
	got := frames(t, strings.NewReader(stream))
	if want := []string{big, `{"ok":1}`}; !slices.Equal(got, want) {
		t.Errorf("got %d frames (first %d bytes), want the 200 KiB frame and the small one; oversized blocks skipped", len(got), len(got[0]))
	}
}

func FuzzSSEReader(f *testing.F) {
	f.Add([]byte("data: {\"a\":1}\n\n"))
	f.Add([]byte("data:\t{\"a\":\ndata: 1}\r\n\r\n: ping\n\n\n"))
	f.Add([]byte("data: [1]\n\ndata: {\n"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		whole := frames(t, bytes.NewReader(stream))
		for _, fr := range whole {
			var v map[string]any
			if err := json.Unmarshal([]byte(fr), &v); err != nil {
				t.Fatalf("frame %q is not a JSON object: %v", fr, err)
			}
		}
		if bytes := frames(t, iotest.OneByteReader(bytes.NewReader(stream))); !slices.Equal(bytes, whole) {
			t.Fatalf("one-byte reads gave %q, whole reads %q", bytes, whole)
		}
	})
}
