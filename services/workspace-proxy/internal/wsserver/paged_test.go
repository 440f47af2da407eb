package wsserver_test

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/telorunner/telorunner/pkg/wsapi"
)

// Walking the tree page by page gives exactly the whole tree, whatever
// bounds the pages (count or bytes), in byte order across directories.
func TestTreePage(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{}
	for i := 0; i < 150; i++ {
		files[fmt.Sprintf("a/b/%03d.txt", i)] = fmt.Sprint(i)
		files[fmt.Sprintf("a-b/%03d", i)] = fmt.Sprint(-i)
	}
	files["é/ü.txt"] = "x"
	files["node_modules/skip.js"] = "excluded"
	writeFiles(t, dir, files)
	f := start(t, dir, nil)
	whole, err := f.c.Tree(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(whole.Files) != 301 {
		t.Fatalf("Tree() lists %d files, want 301", len(whole.Files))
	}
	for _, tc := range []struct {
		name         string
		limit, bytes int
		wantPages    int
	}{
		{"by count", 7, 0, 43},
		{"by bytes", 0, 1000, 0},
		{"one page", 0, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []wsapi.TreeFile
			after, pages := "", 0
			for {
				p, err := f.c.TreePage(t.Context(), after, tc.limit, tc.bytes)
				if err != nil {
					t.Fatalf("TreePage(%q) = %v", after, err)
				}
				pages++
				if len(p.Files) == 0 || (tc.limit > 0 && len(p.Files) > tc.limit) {
					t.Fatalf("page %d has %d files (limit %d)", pages, len(p.Files), tc.limit)
				}
				got = append(got, p.Files...)
				if !p.More {
					break
				}
				after = p.Files[len(p.Files)-1].Path
			}
			if !reflect.DeepEqual(got, whole.Files) {
				t.Fatalf("pages give %d files, want the %d of Tree() in order", len(got), len(whole.Files))
			}
			if tc.wantPages > 0 && pages != tc.wantPages {
				t.Errorf("pages = %d, want %d", pages, tc.wantPages)
			}
			if tc.bytes > 0 && pages < 20 {
				t.Errorf("pages = %d of at most ~1000 bytes each for %d files, want more", pages, len(got))
			}
		})
	}
	// Past the end: an empty last page.
	p, err := f.c.TreePage(t.Context(), whole.Files[len(whole.Files)-1].Path, 0, 0)
	if err != nil || len(p.Files) != 0 || p.More {
		t.Fatalf("TreePage(after the last) = %+v, %v, want no files and no more", p, err)
	}
}

// Ranges of a file carry its size and a stamp that changes when the file
// does; reads past the end are empty; bad requests are refused.
func TestReadRange(t *testing.T) {
	dir := t.TempDir()
	data := bytes.Repeat([]byte("0123456789"), 1000)
	writeFiles(t, dir, map[string]string{"d/f.bin": string(data)})
	f := start(t, dir, nil)
	ctx := t.Context()
	var stamp string
	for _, tc := range []struct {
		offset int64
		length int
		want   []byte
	}{
		{0, 4096, data[:4096]},
		{8192, 4096, data[8192:]},
		{10_000, 10, nil},
		{20_000, 10, nil},
	} {
		r, err := f.c.ReadRange(ctx, "d/f.bin", tc.offset, tc.length)
		if err != nil {
			t.Fatalf("ReadRange(%d, %d) = %v", tc.offset, tc.length, err)
		}
		if !bytes.Equal(r.Data, tc.want) || r.Size != 10_000 {
			t.Fatalf("ReadRange(%d, %d) = %d bytes, size %d, want %d bytes, size 10000", tc.offset, tc.length, len(r.Data), r.Size, len(tc.want))
		}
		if stamp != "" && r.Stamp != stamp {
			t.Fatalf("stamp changed from %s to %s with the file unchanged", stamp, r.Stamp)
		}
		stamp = r.Stamp
	}
	if _, err := f.c.Apply(ctx, wsapi.ChangeSet{Write: []wsapi.WriteOp{{Path: "d/f.bin", Content: string(data)}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := f.c.ReadRange(ctx, "d/f.bin", 0, 10); err != nil || r.Stamp == stamp {
		t.Fatalf("after a rewrite ReadRange() stamp = %q (%v), want one other than %q", r.Stamp, err, stamp)
	}
	for _, tc := range []struct {
		target string
		status int
		code   string
	}{
		{"/workspace/range?path=missing", 404, "file_not_found"},
		{"/workspace/range?path=d", 404, "file_not_found"},
		{"/workspace/range", 400, "invalid_path"},
		{"/workspace/range?path=../x", 400, "invalid_path"},
		{"/workspace/range?path=d/f.bin&length=99999999", 400, "invalid_request"},
		{"/workspace/range?path=d/f.bin&offset=-1", 400, "invalid_request"},
	} {
		if status, code, body := f.call(t, http.MethodGet, tc.target, nil); status != tc.status || code != tc.code {
			t.Errorf("GET %s = %d %s, want %d %s", tc.target, status, body, tc.status, tc.code)
		}
	}
}

// A staged file is invisible until a change set names it, then lands
// whole with the mode of the file it replaces; an upload is used once.
func TestStage(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"bin/run.sh": "old"})
	if err := os.Chmod(filepath.Join(dir, "bin", "run.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	f := start(t, dir, nil)
	ctx := t.Context()
	const id = "0123456789abcdef0123456789abcdef"
	part1, part2 := bytes.Repeat([]byte{0, 1, 2, 255}, 3000), []byte("#!/bin/sh\n")
	if n, err := f.c.Stage(ctx, id, "bin/run.sh", 0, part1); err != nil || n != int64(len(part1)) {
		t.Fatalf("Stage(0) = %d, %v", n, err)
	}
	if n, err := f.c.Stage(ctx, id, "bin/run.sh", 0, part1); err != nil || n != int64(len(part1)) {
		t.Fatalf("Stage(0) again (a retried chunk) = %d, %v", n, err)
	}
	if n, err := f.c.Stage(ctx, id, "bin/run.sh", int64(len(part1)), part2); err != nil || n != int64(len(part1)+len(part2)) {
		t.Fatalf("Stage(%d) = %d, %v", len(part1), n, err)
	}
	tree, err := f.c.Tree(ctx)
	if err != nil || len(tree.Files) != 1 || tree.Files[0].Hash != sha([]byte("old")) {
		t.Fatalf("Tree() while staged = %+v, %v, want only the old bin/run.sh", tree, err)
	}
	for _, tc := range []struct {
		name, target string
	}{
		{"gap", "/workspace/stage?upload=" + id + "&path=bin/run.sh&offset=99999"},
		{"other path", "/workspace/stage?upload=" + id + "&path=other&offset=0"},
		{"unknown upload past 0", "/workspace/stage?upload=ffffffffffffffff&path=x&offset=5"},
		{"bad id", "/workspace/stage?upload=XYZ&path=x"},
	} {
		if status, code, body := f.call(t, http.MethodPost, tc.target, "data"); status != 400 || code != "invalid_request" {
			t.Errorf("%s: POST %s = %d %s, want 400 invalid_request", tc.name, tc.target, status, body)
		}
	}
	res, err := f.c.Apply(ctx, wsapi.ChangeSet{Write: []wsapi.WriteOp{{Path: "bin/run.sh", Staged: id}, {Path: "small", Content: "s"}}})
	if err != nil || res.Written != 2 {
		t.Fatalf("Apply(staged) = %+v, %v", res, err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "bin", "run.sh"))
	if want := append(append([]byte{}, part1...), part2...); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("bin/run.sh = %d bytes (%v), want the %d staged", len(got), err, len(want))
	}
	if fi, err := os.Stat(filepath.Join(dir, "bin", "run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("bin/run.sh mode = %v (%v), want 0755 kept", fi.Mode(), err)
	}
	if left := tempFiles(t, dir); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
	// Used once: a second change set naming it changes nothing.
	if status, code, body := f.call(t, http.MethodPost, "/workspace", map[string]any{"write": []map[string]string{{"path": "small", "content": "t"}, {"path": "bin/run.sh", "staged": id}}}); status != 400 || code != "invalid_request" {
		t.Fatalf("apply of a used upload = %d %s, want 400 invalid_request", status, body)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "small")); string(got) != "s" {
		t.Fatalf("small = %q after a refused change set, want it unchanged", got)
	}
	// Discard drops the temporary file.
	const id2 = "abcdefabcdefabcdef"
	if _, err := f.c.Stage(ctx, id2, "new/dir/f", 0, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if left := tempFiles(t, dir); len(left) != 1 {
		t.Fatalf("temporary files while staged: %v, want one", left)
	}
	if err := f.c.Discard(ctx, id2); err != nil {
		t.Fatal(err)
	}
	if left := tempFiles(t, dir); len(left) != 0 {
		t.Fatalf("temporary files after Discard: %v", left)
	}
	// A staged write takes the mode its change set asks for.
	const id3 = "1111222233334444"
	if _, err := f.c.Stage(ctx, id3, "bin/tool", 0, []byte("#!/bin/sh\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.c.Apply(ctx, wsapi.ChangeSet{Write: []wsapi.WriteOp{{Path: "bin/tool", Staged: id3, Mode: 0o750}}}); err != nil {
		t.Fatalf("Apply(staged, mode 0750) = %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "bin", "tool")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Fatalf("bin/tool mode = %v (%v), want 0750", fi.Mode(), err)
	}
}
