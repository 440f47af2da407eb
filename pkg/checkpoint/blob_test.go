package checkpoint

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestBlob(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	data := []byte("kind: Telo.Application\nmetadata:\n  name: blob\n")
	if _, _, err := s.Take(t.Context(), newID(), newMemWorkspace(map[string][]byte{"telo.yaml": data})); err != nil {
		t.Fatalf("Take() = %v", err)
	}
	h := hashOf(data)
	for _, name := range []string{h, strings.ToUpper(h)} {
		got, err := s.Blob(t.Context(), name)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("Blob(%s) = %q, %v; want %q", name, got, err, data)
		}
	}
	if _, err := s.Blob(t.Context(), hashOf([]byte("never stored"))); !errors.Is(err, ErrMissingBlob) {
		t.Fatalf("Blob(absent) = %v, want ErrMissingBlob", err)
	}
	if _, err := s.Blob(t.Context(), "../etc/passwd"); err == nil {
		t.Fatal("Blob(not a hash) = nil error")
	}
}
