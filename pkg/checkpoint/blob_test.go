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
	small := []byte("kind: Telo.Application\nmetadata:\n  name: blob\n")
	large := make([]byte, 300_000) // Several object chunks: the object store's path.
	for i := range large {
		large[i] = byte(i * 7)
	}
	if _, _, err := s.Take(t.Context(), newID(), newMemWorkspace(map[string][]byte{"telo.yaml": small, "big.bin": large})); err != nil {
		t.Fatalf("Take() = %v", err)
	}
	for _, data := range [][]byte{small, large} {
		h := hashOf(data)
		for _, name := range []string{h, strings.ToUpper(h)} {
			got, err := s.Blob(t.Context(), name)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("Blob(%s) = %d bytes, %v; want %d identical bytes", name, len(got), err, len(data))
			}
		}
	}
	if _, err := s.Blob(t.Context(), hashOf([]byte("never stored"))); !errors.Is(err, ErrMissingBlob) {
		t.Fatalf("Blob(absent) = %v, want ErrMissingBlob", err)
	}
	if _, err := s.Blob(t.Context(), "../etc/passwd"); err == nil {
		t.Fatal("Blob(not a hash) = nil error")
	}
}
