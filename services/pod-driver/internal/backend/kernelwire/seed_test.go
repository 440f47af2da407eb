package kernelwire

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// workspaceServerPath is the real workspace-server binary, built once
// into binDir (removed by TestMain).
var (
	buildOnce           sync.Once
	binDir              string
	workspaceServerPath string
	workspaceServerErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func workspaceServer(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kernelwire-test-")
		if err != nil {
			workspaceServerErr = err
			return
		}
		binDir = dir
		workspaceServerPath = filepath.Join(dir, "workspace-server")
		cmd := exec.Command("go", "build", "-o", workspaceServerPath, "./cmd/workspace-server")
		cmd.Dir = filepath.Join("..", "..", "..", "..", "workspace-proxy")
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			workspaceServerErr = fmt.Errorf("build workspace-server: %v\n%s", err, out)
		}
	})
	if workspaceServerErr != nil {
		t.Fatal(workspaceServerErr)
	}
	return workspaceServerPath
}

// posted is one POST /workspace the seed sent, as the server got it.
type posted struct {
	size   int
	paths  []string
	start  time.Time
	finish time.Time
}

// spy is an http.RoundTripper in front of the real transport that records
// every change set posted and how many were in flight at once.
type spy struct {
	next     http.RoundTripper
	mu       sync.Mutex
	posts    []posted
	inFlight atomic.Int64
	peak     atomic.Int64
	written  atomic.Int64 // content bytes of change sets answered
}

func (s *spy) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPost || r.URL.Path != "/workspace" {
		return s.next.RoundTrip(r)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	_ = r.Body.Close()
	var cs ChangeSet
	if err := json.Unmarshal(body, &cs); err != nil {
		return nil, err
	}
	p := posted{size: len(body), start: time.Now()}
	var content int64
	for _, w := range cs.Write {
		p.paths = append(p.paths, w.Path)
		content += int64(len(w.Content))
		if w.Encoding == "base64" {
			content = content - int64(len(w.Content)) + int64(base64.StdEncoding.DecodedLen(len(w.Content)))
		}
	}
	n := s.inFlight.Add(1)
	for old := s.peak.Load(); n > old && !s.peak.CompareAndSwap(old, n); old = s.peak.Load() {
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	resp, err := s.next.RoundTrip(r)
	s.written.Add(content)
	s.inFlight.Add(-1)
	p.finish = time.Now()
	s.mu.Lock()
	s.posts = append(s.posts, p)
	s.mu.Unlock()
	return resp, err
}

// liveWorkspace runs a real workspace server over a temporary directory.
type liveWorkspace struct {
	dir string
	c   WorkspaceClient
	spy *spy
}

func startWorkspace(t *testing.T) *liveWorkspace {
	t.Helper()
	bin := workspaceServer(t)
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "WORKSPACE_DIR="+dir, "PORT="+strconv.Itoa(port), "WORKSPACE_BIND=127.0.0.1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sp := &spy{next: &http.Transport{}}
	ws := &liveWorkspace{dir: dir, spy: sp, c: WorkspaceClient{Base: "http://127.0.0.1:" + strconv.Itoa(port), HTTP: &http.Client{Transport: sp}}}
	if !testkit.Poll(t.Context(), 10*time.Second, func() bool { return ws.c.Ping(t.Context()) == nil }) {
		t.Fatal("workspace server never answered")
	}
	return ws
}

// tree reads every file under the workspace directory.
func (w *liveWorkspace) tree(t *testing.T) map[string][]byte {
	t.Helper()
	got := map[string][]byte{}
	err := filepath.WalkDir(w.dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		rel, _ := filepath.Rel(w.dir, p)
		got[filepath.ToSlash(rel)] = data
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// blobs is a content-addressed source that counts fetches per hash.
type blobs struct {
	mu      sync.Mutex
	data    map[string][]byte
	fetches map[string]int
	fail    string // a hash whose fetch fails
}

func newBlobs() *blobs { return &blobs{data: map[string][]byte{}, fetches: map[string]int{}} }

func (b *blobs) put(data []byte) string {
	sum := sha256.Sum256(data)
	h := hex.EncodeToString(sum[:])
	b.mu.Lock()
	b.data[h] = data
	b.mu.Unlock()
	return h
}

func (b *blobs) fetch(_ context.Context, hash string) ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fetches[hash]++
	if hash == b.fail {
		return nil, errors.New("the store does not answer")
	}
	d, ok := b.data[hash]
	if !ok {
		return nil, errors.New("blob missing")
	}
	return d, nil
}

func randomBytes(rnd *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rnd.Uint32())
	}
	return b
}

// TestSeedSplitsIntoBoundedChangeSets seeds 24 MiB in 24 files with 2 MiB
// change sets: many change sets, none over the bound (plus one write's
// JSON), at most InFlight posted at once, the entry and then the marker
// posted after every other change set finished, and the tree exact.
func TestSeedSplitsIntoBoundedChangeSets(t *testing.T) {
	ws := startWorkspace(t)
	rnd := rand.New(rand.NewPCG(7, 8))
	src := newBlobs()
	want := map[string][]byte{}
	var files []backend.RestoreFile
	for i := range 24 {
		p := fmt.Sprintf("data/part-%02d.bin", i)
		data := randomBytes(rnd, 1<<20)
		want[p] = data
		files = append(files, backend.RestoreFile{Path: p, Hash: src.put(data), Size: int64(len(data))})
	}
	entry := []byte("kind: Telo.Application\nmetadata:\n  name: web\n  version: 1.0.0\n")
	want["web/telo.yaml"] = entry
	files = append(files, backend.RestoreFile{Path: "web/telo.yaml", Hash: src.put(entry), Size: int64(len(entry))})
	want[MarkerPath] = []byte(MarkerContent)

	seed, err := RestoreSeed(backend.Restore{Files: files, Fetch: src.fetch})
	if err != nil {
		t.Fatal(err)
	}
	const chunk, inFlight = 2 << 20, 3
	st, err := ws.c.Seed(t.Context(), seed, SeedOptions{ChunkBytes: chunk, InFlight: inFlight, Fetches: 4, Last: []string{"web/telo.yaml"}})
	if err != nil {
		t.Fatalf("Seed() = %v", err)
	}
	got := ws.tree(t)
	if len(got) != len(want) {
		t.Fatalf("tree has %d files, want %d", len(got), len(want))
	}
	for p, data := range want {
		if !bytes.Equal(got[p], data) {
			t.Fatalf("%s: %d bytes, want %d identical bytes", p, len(got[p]), len(data))
		}
	}
	posts := ws.spy.posts
	if len(posts) < 10 || st.ChangeSets != len(posts) {
		t.Fatalf("%d change sets posted (stats %d), want at least 10 for 24 MiB in 2 MiB sets", len(posts), st.ChangeSets)
	}
	oneWrite := base64Len(1<<20) + 200
	for _, p := range posts {
		if p.size > chunk+oneWrite {
			t.Fatalf("a change set of %d bytes, over the %d-byte bound", p.size, chunk+oneWrite)
		}
	}
	if peak := ws.spy.peak.Load(); peak > inFlight || peak < 2 {
		t.Fatalf("%d change sets in flight at the peak, want 2..%d", peak, inFlight)
	}
	// The entry's and the marker's change sets come last, in that order.
	n := len(posts)
	lastTwo := posts[n-2:]
	if !equalPaths(lastTwo[0].paths, []string{"web/telo.yaml"}) || !equalPaths(lastTwo[1].paths, []string{MarkerPath}) {
		// They may share one change set when small: entry then marker.
		if !equalPaths(posts[n-1].paths, []string{"web/telo.yaml", MarkerPath}) {
			t.Fatalf("last change sets hold %v then %v, want the entry then the marker", lastTwo[0].paths, lastTwo[1].paths)
		}
		lastTwo = posts[n-1:]
	}
	for _, p := range posts[:n-len(lastTwo)] {
		if p.finish.After(lastTwo[0].start) {
			t.Fatalf("a change set of %v finished after the entry's was sent", p.paths)
		}
	}
	if st.Fetched != 25 || st.Written != 26 || st.Files != 26 || st.Bytes != 24<<20+int64(len(entry)+len(MarkerContent)) {
		t.Fatalf("stats %+v", st)
	}
}

// TestSeedFetchesEachHashOnce seeds into a workspace that is not empty
// (a directory reused on this machine): content at several paths is
// fetched once; a path already holding its content is not written, and
// that content is read back from the workspace for another path rather
// than fetched; a path with other content is rewritten; what the seed
// lacks, and the old marker, are deleted (the marker is written anew,
// last).
func TestSeedFetchesEachHashOnce(t *testing.T) {
	ws := startWorkspace(t)
	src := newBlobs()
	shared := bytes.Repeat([]byte("shared "), 50_000)
	same := []byte("already at its path\n")
	changed := []byte("new content\n")
	if err := ws.c.Apply(t.Context(), ChangeSet{Write: []Write{
		{Path: "same.txt", Content: string(same), Encoding: "utf8"},
		{Path: "changed.txt", Content: "old content\n", Encoding: "utf8"},
		{Path: "stale/extra.txt", Content: "not in the checkpoint\n", Encoding: "utf8"},
		{Path: MarkerPath, Content: MarkerContent, Encoding: "utf8"},
	}}); err != nil {
		t.Fatal(err)
	}
	hs, hm, hc := src.put(shared), src.put(same), src.put(changed)
	var files []backend.RestoreFile
	for i := range 30 {
		files = append(files, backend.RestoreFile{Path: fmt.Sprintf("copies/%02d/shared.txt", i), Hash: hs})
	}
	files = append(files,
		backend.RestoreFile{Path: "same.txt", Hash: hm},
		backend.RestoreFile{Path: "copy/same.txt", Hash: strings.ToUpper(hm)},
		backend.RestoreFile{Path: "changed.txt", Hash: hc})
	seed, err := RestoreSeed(backend.Restore{Files: files, Fetch: src.fetch})
	if err != nil {
		t.Fatal(err)
	}
	st, err := ws.c.Seed(t.Context(), seed, SeedOptions{ChunkBytes: 1 << 20})
	if err != nil {
		t.Fatalf("Seed() = %v", err)
	}
	if src.fetches[hs] != 1 || src.fetches[hm] != 0 || src.fetches[hc] != 1 {
		t.Fatalf("fetches %v: want shared and changed once, same never", src.fetches)
	}
	if st.Fetched != 2 || st.FromWorkspace != 1 || st.Unchanged != 1 || st.Deleted != 2 || st.Written != 33 {
		t.Fatalf("stats %+v: want 2 fetched, 1 from the workspace, 1 unchanged, 2 deleted, 33 written", st)
	}
	got := ws.tree(t)
	if len(got) != 34 {
		t.Fatalf("tree %v: want 34 files", keys(got))
	}
	for i := range 30 {
		if p := fmt.Sprintf("copies/%02d/shared.txt", i); !bytes.Equal(got[p], shared) {
			t.Fatalf("%s: %d bytes, want %d", p, len(got[p]), len(shared))
		}
	}
	if !bytes.Equal(got["copy/same.txt"], same) || !bytes.Equal(got["same.txt"], same) || !bytes.Equal(got["changed.txt"], changed) || string(got[MarkerPath]) != MarkerContent {
		t.Fatalf("tree %v", keys(got))
	}
	// The marker went first and came back last.
	posts := ws.spy.posts
	if first := posts[1]; !slices.Equal(first.paths, nil) { // posts[0] is the setup
		t.Fatalf("first change set of the seed writes %v, want only deletes", first.paths)
	}
	if last := posts[len(posts)-1].paths; last[len(last)-1] != MarkerPath {
		t.Fatalf("last write %v, want the marker", last)
	}
}

// TestSeedMemoryBounded: 32 MiB of 512 KiB blobs, the store answering at
// once, a 2 MiB fetch budget, 1 MiB change sets, two in flight: the bytes
// fetched and not yet written never exceed the budget plus the change
// sets being packed and posted, whatever the workspace's size.
func TestSeedMemoryBounded(t *testing.T) {
	ws := startWorkspace(t)
	rnd := rand.New(rand.NewPCG(1, 5))
	src := newBlobs()
	var files []backend.RestoreFile
	const n, size = 64, 512 << 10
	for i := range n {
		data := randomBytes(rnd, size)
		files = append(files, backend.RestoreFile{Path: fmt.Sprintf("m/%02d.bin", i), Hash: src.put(data), Size: size})
	}
	var fetchedBytes, peak atomic.Int64
	fetch := func(ctx context.Context, hash string) ([]byte, error) {
		data, err := src.fetch(ctx, hash)
		held := fetchedBytes.Add(int64(len(data))) - ws.spy.written.Load()
		for old := peak.Load(); held > old && !peak.CompareAndSwap(old, held); old = peak.Load() {
		}
		return data, err
	}
	seed, err := RestoreSeed(backend.Restore{Files: files, Fetch: fetch})
	if err != nil {
		t.Fatal(err)
	}
	const budget, chunk, inFlight = 2 << 20, 1 << 20, 2
	if _, err := ws.c.Seed(t.Context(), seed, SeedOptions{FetchBytes: budget, ChunkBytes: chunk, InFlight: inFlight, Fetches: 16}); err != nil {
		t.Fatalf("Seed() = %v", err)
	}
	// Packed and in flight: inFlight change sets posted, one handed over,
	// one being packed, each at most a chunk of base64 (3/4 of it raw).
	bound := int64(budget + (inFlight+2)*chunk*3/4 + size)
	if p := peak.Load(); p > bound {
		t.Fatalf("%d bytes fetched and not written at the peak, over the %d-byte bound", p, bound)
	}
	if got := len(ws.tree(t)); got != n+1 {
		t.Fatalf("tree has %d files, want %d", got, n+1)
	}
}

// TestSeedFailureWritesNoMarker: a blob the store cannot give fails the
// seed naming it, and the marker — the sign of a complete seed — is not
// written.
func TestSeedFailureWritesNoMarker(t *testing.T) {
	ws := startWorkspace(t)
	src := newBlobs()
	var files []backend.RestoreFile
	for i := range 20 {
		files = append(files, backend.RestoreFile{Path: fmt.Sprintf("f%02d", i), Hash: src.put([]byte(strconv.Itoa(i)))})
	}
	src.fail = files[7].Hash
	seed, err := RestoreSeed(backend.Restore{Files: files, Fetch: src.fetch})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ws.c.Seed(t.Context(), seed, SeedOptions{})
	if err == nil || !strings.Contains(err.Error(), files[7].Hash) || !strings.Contains(err.Error(), "the store does not answer") {
		t.Fatalf("Seed() = %v, want the failed fetch named", err)
	}
	if _, ok := ws.tree(t)[MarkerPath]; ok {
		t.Fatal("the marker was written by a failed seed")
	}
}

// TestSeedModes: a file's mode in the restore is its mode on disk; a file
// with none gets the server's default.
func TestSeedModes(t *testing.T) {
	ws := startWorkspace(t)
	src := newBlobs()
	script, data := []byte("#!/bin/sh\necho hi\n"), []byte("plain\n")
	seed, err := RestoreSeed(backend.Restore{Files: []backend.RestoreFile{
		{Path: "bin/run.sh", Hash: src.put(script), Mode: 0o755},
		{Path: "secret.txt", Hash: src.put(data), Mode: 0o600},
		{Path: "plain.txt", Hash: src.put(append([]byte("x"), data...))},
	}, Fetch: src.fetch})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.c.Seed(t.Context(), seed, SeedOptions{}); err != nil {
		t.Fatalf("Seed() = %v", err)
	}
	for p, want := range map[string]os.FileMode{"bin/run.sh": 0o755, "secret.txt": 0o600, "plain.txt": 0o644} {
		fi, err := os.Stat(filepath.Join(ws.dir, filepath.FromSlash(p)))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
}

func TestRestoreSeedRefusesBadInput(t *testing.T) {
	h := strings.Repeat("a", 64)
	fetch := func(context.Context, string) ([]byte, error) { return nil, nil }
	for name, r := range map[string]backend.Restore{
		"escaping path": {Files: []backend.RestoreFile{{Path: "../x", Hash: h}}, Fetch: fetch},
		"twice":         {Files: []backend.RestoreFile{{Path: "a", Hash: h}, {Path: "./a", Hash: h}}, Fetch: fetch},
		"bad hash":      {Files: []backend.RestoreFile{{Path: "a", Hash: "abc"}}, Fetch: fetch},
		"no source":     {Files: []backend.RestoreFile{{Path: "a", Hash: h}}},
	} {
		if _, err := RestoreSeed(r); err == nil {
			t.Errorf("%s: RestoreSeed() = nil error", name)
		}
	}
}

// TestSeedBundle: a bundle (create) seeds through the same path, inline,
// with the marker last.
func TestSeedBundle(t *testing.T) {
	ws := startWorkspace(t)
	seed, err := BundleSeed([]contract.BundleFile{
		{RelativePath: "telo.yaml", Contents: "kind: Telo.Application\n"},
		{RelativePath: "bin/x", Contents: "AAEC", Encoding: "base64"},
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := ws.c.Seed(t.Context(), seed, SeedOptions{Last: []string{"telo.yaml"}})
	if err != nil {
		t.Fatal(err)
	}
	got := ws.tree(t)
	if string(got["telo.yaml"]) != "kind: Telo.Application\n" || !bytes.Equal(got["bin/x"], []byte{0, 1, 2}) || string(got[MarkerPath]) != MarkerContent {
		t.Fatalf("tree %v", keys(got))
	}
	if st.Written != 3 || st.Fetched != 0 || st.Bytes != int64(len("kind: Telo.Application\n")+3+len(MarkerContent)) {
		t.Fatalf("stats %+v", st)
	}
	last := ws.spy.posts[len(ws.spy.posts)-1].paths
	if last[len(last)-1] != MarkerPath {
		t.Fatalf("last write %v, want the marker", last)
	}
}

func base64Len(n int) int { return (n + 2) / 3 * 4 }

func equalPaths(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") }

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A file whose base64 is larger than one workspace server request (70 MiB
// → 93 MiB encoded, over the 64 MiB limit) is staged in chunks and
// committed whole with its mode: it seeds, byte-exact, and no request
// carries it.
func TestSeedStagesAFileOverTheRequestLimit(t *testing.T) {
	ws := startWorkspace(t)
	rnd := rand.New(rand.NewPCG(9, 10))
	src := newBlobs()
	big := randomBytes(rnd, 70<<20)
	small := []byte("kind: Telo.Application\nmetadata:\n  name: web\n")
	files := []backend.RestoreFile{
		{Path: "assets/big.bin", Hash: src.put(big), Size: int64(len(big)), Mode: 0o755},
		{Path: "telo.yaml", Hash: src.put(small), Size: int64(len(small))},
	}
	seed, err := RestoreSeed(backend.Restore{Files: files, Fetch: src.fetch})
	if err != nil {
		t.Fatal(err)
	}
	st, err := ws.c.Seed(t.Context(), seed, SeedOptions{Last: []string{"telo.yaml"}})
	if err != nil {
		t.Fatalf("Seed() = %v", err)
	}
	if st.Staged != 1 {
		t.Fatalf("staged %d files, want 1", st.Staged)
	}
	got := ws.tree(t)
	if !bytes.Equal(got["assets/big.bin"], big) || !bytes.Equal(got["telo.yaml"], small) {
		t.Fatalf("tree after the seed: big.bin %d bytes, telo.yaml %q; want %d identical bytes and the manifest", len(got["assets/big.bin"]), got["telo.yaml"], len(big))
	}
	fi, err := os.Stat(filepath.Join(ws.dir, "assets", "big.bin"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("big.bin: %v, %v; want mode 0755", fi, err)
	}
	for _, p := range ws.spy.posts {
		if p.size > 2*StageChunk {
			t.Fatalf("a change set of %d bytes: the big file travelled in a request", p.size)
		}
	}
}
