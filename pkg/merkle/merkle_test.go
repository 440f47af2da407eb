package merkle

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
)

func h(s string) string { return Hash([]byte(s)) }

func files() []File {
	return []File{
		{Path: "telo.yaml", Hash: h("telo"), Size: 4, Mode: 0o644},
		{Path: "bin/run.sh", Hash: h("run"), Size: 3, Mode: 0o755},
		{Path: "src/a/x.yaml", Hash: h("x"), Size: 1, Mode: 0o644},
		{Path: "src/b/y.yaml", Hash: h("y"), Size: 1, Mode: 0o644},
	}
}

func TestBuild(t *testing.T) {
	b, err := Build(files())
	if err != nil {
		t.Fatalf("Build() = %v", err)
	}
	// root, bin, src, src/a, src/b
	if len(b.Nodes) != 5 {
		t.Fatalf("Build() = %d nodes, want 5", len(b.Nodes))
	}
	for hash, data := range b.Nodes {
		if Hash(data) != hash {
			t.Fatalf("node %s: encoding hashes to %s", hash, Hash(data))
		}
		n, err := Decode(data)
		if err != nil {
			t.Fatalf("Decode(%s) = %v", data, err)
		}
		if string(n.Encode()) != string(data) {
			t.Fatalf("Encode(Decode(%s)) = %s: not canonical", data, n.Encode())
		}
	}
	root, _ := Decode(b.Nodes[b.Root])
	if f, size := root.Totals(); f != 4 || size != 9 {
		t.Fatalf("root totals = %d files, %d bytes; want 4, 9", f, size)
	}
	// Order does not matter; content and modes do.
	rev := slices.Clone(files())
	slices.Reverse(rev)
	if b2, _ := Build(rev); b2.Root != b.Root {
		t.Fatal("Build() depends on the listing's order")
	}
	chmod := files()
	chmod[0].Mode = 0o755
	if b3, _ := Build(chmod); b3.Root == b.Root {
		t.Fatal("a mode change did not change the root")
	}
	edit := files()
	edit[2].Hash = h("x2")
	b4, _ := Build(edit)
	shared := 0
	for k := range b4.Nodes {
		if _, ok := b.Nodes[k]; ok {
			shared++
		}
	}
	if shared != 2 { // bin and src/b; root, src and src/a are new.
		t.Fatalf("after one edit %d nodes shared, want 2", shared)
	}

	get := func(_ context.Context, hash string) (Node, error) {
		data, ok := b.Nodes[hash]
		if !ok {
			return Node{}, errors.New("missing")
		}
		return DecodeAs(hash, data)
	}
	flat, err := Flatten(t.Context(), b.Root, get, 2)
	if err != nil {
		t.Fatalf("Flatten() = %v", err)
	}
	byPath := func(fs []File) map[string]File {
		m := map[string]File{}
		for _, f := range fs {
			m[f.Path] = f
		}
		return m
	}
	if !maps.Equal(byPath(flat), byPath(files())) {
		t.Fatalf("Flatten() = %v, want %v", flat, files())
	}
}

func TestBuildRejects(t *testing.T) {
	for name, fs := range map[string][]File{
		"twice":             {{Path: "a", Hash: h("a")}, {Path: "a", Hash: h("a")}},
		"file and dir":      {{Path: "a", Hash: h("a")}, {Path: "a/b", Hash: h("b")}},
		"dir and file":      {{Path: "a/b", Hash: h("b")}, {Path: "a", Hash: h("a")}},
		"bad hash":          {{Path: "a", Hash: "x"}},
		"mode beyond perms": {{Path: "a", Hash: h("a"), Mode: 0o1777}},
		"empty segment":     {{Path: "a//b", Hash: h("a")}},
		"not utf-8":         {{Path: "dir\xff/a", Hash: h("a")}},
	} {
		if _, err := Build(fs); err == nil {
			t.Errorf("Build(%s) = nil, want an error", name)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	good := h("a")
	for name, data := range map[string]string{
		"not json":   `[`,
		"dot":        `{"entries":[{"name":"..","kind":"dir","hash":"` + good + `","size":0}]}`,
		"slash":      `{"entries":[{"name":"a/b","kind":"file","hash":"` + good + `","size":0}]}`,
		"upper hash": `{"entries":[{"name":"a","kind":"file","hash":"` + "A" + good[1:] + `","size":0}]}`,
		"kind":       `{"entries":[{"name":"a","kind":"link","hash":"` + good + `","size":0}]}`,
		"negative":   `{"entries":[{"name":"a","kind":"file","hash":"` + good + `","size":-1}]}`,
		"order":      `{"entries":[{"name":"b","kind":"file","hash":"` + good + `","size":0},{"name":"a","kind":"file","hash":"` + good + `","size":0}]}`,
	} {
		if _, err := Decode([]byte(data)); err == nil {
			t.Errorf("Decode(%s) = nil, want an error", name)
		}
	}
	if _, err := DecodeAs(h("other"), []byte(`{"entries":[]}`)); !errors.Is(err, ErrNodeMismatch) {
		t.Fatalf("DecodeAs(wrong hash) = %v, want ErrNodeMismatch", err)
	}
}
