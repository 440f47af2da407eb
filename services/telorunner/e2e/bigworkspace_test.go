package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/testkit"
)

// startBigWorkspace starts a watch session and returns its id and its
// workspace directory on disk (local backend).
func startBigWorkspace(t *testing.T, r *runner) (string, string) {
	t.Helper()
	c := r.create(t, watchBody(map[string]string{"telo.yaml": manifest("big", nil, nil)}, []app{{Name: "app", Entry: "telo.yaml"}}, ""))
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	sse.until(t, 60*time.Second, isStatus("running"))
	sse.until(t, 30*time.Second, isRun("app", "started", 1))
	return c.SessionID, workspaceDir(t, r.DataDir)
}

// randomBytes is n bytes of a seeded generator: binary, every byte value.
func randomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := rng.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// readFileStreaming GETs a file with encoding=base64 and decodes the body
// as it arrives, returning the SHA-256 and length of the content and the
// size field, so the test holds no copy of a large file. pause, when set,
// runs once after the first MiB of content was read.
func readFileStreaming(t *testing.T, url string, pause func()) (sum string, n int64, size int64, err error) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s = %d %s, want 200", url, resp.StatusCode, body)
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	head := make([]byte, len(`{"content":"`))
	if _, err := io.ReadFull(br, head); err != nil || string(head) != `{"content":"` {
		return "", 0, 0, fmt.Errorf("body starts %q (%v), want {\"content\":\"", head, err)
	}
	// The content ends at the first quote: base64 has none.
	content := &untilQuote{r: br}
	h := sha256.New()
	src := io.Reader(base64.NewDecoder(base64.StdEncoding, content))
	if pause != nil {
		if n, err = io.CopyN(h, src, 1<<20); err != nil {
			return "", n, 0, err
		}
		pause()
	}
	m, err := io.Copy(h, src)
	n += m
	if err != nil {
		return "", n, 0, err
	}
	rest, err := io.ReadAll(br)
	if err != nil {
		return "", n, 0, err
	}
	var tail struct {
		Size int64 `json:"size"`
	}
	if err := json.Unmarshal(append([]byte("{"), bytes.TrimPrefix(rest, []byte(","))...), &tail); err != nil {
		return "", n, 0, fmt.Errorf("body ends %q: %v", rest, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, tail.Size, nil
}

// untilQuote reads up to (not including) the first '"' and then EOF.
type untilQuote struct {
	r    *bufio.Reader
	done bool
}

func (u *untilQuote) Read(p []byte) (int, error) {
	if u.done {
		return 0, io.EOF
	}
	if u.r.Buffered() == 0 {
		if _, err := u.r.Peek(1); err != nil {
			return 0, err
		}
	}
	buf, _ := u.r.Peek(min(len(p), u.r.Buffered()))
	if i := bytes.IndexByte(buf, '"'); i >= 0 {
		n := copy(p, buf[:i])
		_, _ = u.r.Discard(i + 1)
		u.done = true
		return n, nil
	}
	n := copy(p, buf)
	_, _ = u.r.Discard(n)
	return n, nil
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// heapPeak samples the process's live heap (as of the last GC) and heap
// in use until stop is called, and returns the peaks' growth over the
// level when it started. Edge, workspace-proxy and NATS run in this
// process (the all-in-one); the workspace server is its own process.
func heapPeak() (stop func() (live, inuse int64)) {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	read := func() (int64, int64) {
		metrics.Read(sample)
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(sample[0].Value.Uint64()), int64(ms.HeapInuse)
	}
	runtime.GC()
	baseLive, baseInuse := read()
	var peakLive, peakInuse atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			live, inuse := read()
			if live > peakLive.Load() {
				peakLive.Store(live)
			}
			if inuse > peakInuse.Load() {
				peakInuse.Store(inuse)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() (int64, int64) {
		close(done)
		wg.Wait()
		return peakLive.Load() - baseLive, peakInuse.Load() - baseInuse
	}
}

// No size cliff on the workspace routes (issue 15): binary files of 5 MB
// (written through POST) and 50 MB (written by the agent, on disk) read
// back byte for byte as base64 through edge, workspace-proxy and the
// workspace server, each bus message one bounded page; a 20 MB write and
// its read back; the edge and proxy hold a bounded amount of the 50 MB
// file at any time; and a file replaced during a paged read cuts the
// response instead of answering a mix of two versions.
func TestWorkspaceLargeFiles(t *testing.T) {
	// No periodic checkpoint during the test: it reads the same files in
	// this process and would blur what the read path holds. The
	// supervisor takes a session's first checkpoint at its first tick:
	// wait for it, the next is an hour away.
	r := watchRunner(t, map[string]string{"RUNNER_WORKSPACE_CHECKPOINT_SECONDS": "3600"})
	id, ws := startBigWorkspace(t, r)
	base := r.URL + "/v1/sessions/" + id + "/workspace"
	testkit.Eventually(t, 60*time.Second, func() bool {
		var list struct {
			Checkpoints []json.RawMessage `json:"checkpoints"`
		}
		do(t, "GET", r.URL+"/v1/sessions/"+id+"/checkpoints", nil, nil).json(t, &list)
		return len(list.Checkpoints) > 0
	}, "the session's first checkpoint")

	write := func(path string, data []byte) {
		t.Helper()
		body := map[string]any{"write": []map[string]any{{"path": path, "content": base64.StdEncoding.EncodeToString(data), "encoding": "base64"}}}
		start := time.Now()
		resp := do(t, "POST", base, body, nil)
		if resp.Status != http.StatusOK || string(resp.Body) != `{"written":1,"deleted":0}` {
			t.Fatalf("POST %d bytes to %s = %d %s, want 200 {\"written\":1,\"deleted\":0}", len(data), path, resp.Status, resp.Body)
		}
		t.Logf("wrote %d MB in %v", len(data)>>20, time.Since(start).Round(time.Millisecond))
	}
	readBack := func(path string, want []byte) {
		t.Helper()
		start := time.Now()
		sum, n, size, err := readFileStreaming(t, base+"/file?path="+path+"&encoding=base64", nil)
		if err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		if n != int64(len(want)) || size != int64(len(want)) || sum != sha(want) {
			t.Fatalf("read %s = %d bytes (size %d) sha256 %s, want %d bytes sha256 %s", path, n, size, sum, len(want), sha(want))
		}
		t.Logf("read %d MB in %v", len(want)>>20, time.Since(start).Round(time.Millisecond))
	}

	five := randomBytes(5<<20, 5)
	write("assets/five.bin", five)
	if got, err := os.ReadFile(filepath.Join(ws, "assets", "five.bin")); err != nil || !bytes.Equal(got, five) {
		t.Fatalf("assets/five.bin on disk: %d bytes (%v), want the 5 MB written", len(got), err)
	}
	readBack("assets/five.bin", five)

	twenty := randomBytes(20<<20, 20)
	body, _ := json.Marshal(map[string]any{"write": []map[string]any{{"path": "assets/twenty.bin", "content": base64.StdEncoding.EncodeToString(twenty), "encoding": "base64"}}})
	stopWrite := heapPeak()
	start := time.Now()
	if resp := do(t, "POST", base, body, nil); resp.Status != http.StatusOK || string(resp.Body) != `{"written":1,"deleted":0}` {
		t.Fatalf("POST 20 MB = %d %s, want 200 {\"written\":1,\"deleted\":0}", resp.Status, resp.Body)
	}
	wlive, winuse := stopWrite()
	t.Logf("wrote 20 MB (a %d MB body) in %v; peak growth of the all-in-one's heap: live %.1f MiB, in use %.1f MiB",
		len(body)>>20, time.Since(start).Round(time.Millisecond), float64(wlive)/(1<<20), float64(winuse)/(1<<20))
	// A write is bounded by its body (decoded whole at the edge), not constant.
	if wlive > 5*int64(len(body)) {
		t.Errorf("live heap grew by %d MiB writing a %d MiB body, want at most 5 times the body", wlive>>20, len(body)>>20)
	}
	body = nil
	readBack("assets/twenty.bin", twenty)
	twenty = nil

	// A mid-size UTF-8 text over several pages: byte-exact JSON text,
	// runes split across page boundaries included.
	text := strings.Repeat("héllo <wörld> & ünïcode ✓ \"quoted\"\n", 60_000)
	if resp := do(t, "POST", base, map[string]any{"write": []map[string]any{{"path": "notes/big.txt", "content": text}}}, nil); resp.Status != http.StatusOK {
		t.Fatalf("POST big text = %d %s", resp.Status, resp.Body)
	}
	resp := do(t, "GET", base+"/file?path=notes/big.txt", nil, nil)
	want, _ := json.Marshal(map[string]any{"content": text, "size": len(text)})
	if resp.Status != http.StatusOK || !bytes.Equal(resp.Body, want) {
		t.Fatalf("GET big text = %d, %d bytes, want 200 and %d bytes equal to encoding/json's", resp.Status, len(resp.Body), len(want))
	}

	fifty := randomBytes(50<<20, 50)
	fiftySum := sha(fifty)
	if err := os.WriteFile(filepath.Join(ws, "fifty.bin"), fifty, 0o644); err != nil {
		t.Fatal(err)
	}
	fifty = nil
	stop := heapPeak()
	start = time.Now()
	sum, n, size, err := readFileStreaming(t, base+"/file?path=fifty.bin&encoding=base64", nil)
	live, inuse := stop()
	if err != nil || sum != fiftySum || n != 50<<20 || size != 50<<20 {
		t.Fatalf("read fifty.bin = %d bytes (size %d) sha256 %s (%v), want 52428800 bytes sha256 %s", n, size, sum, err, fiftySum)
	}
	t.Logf("read 50 MB in %v; peak growth of the all-in-one's heap (edge, proxy, NATS): live %.1f MiB, in use %.1f MiB",
		time.Since(start).Round(time.Millisecond), float64(live)/(1<<20), float64(inuse)/(1<<20))
	// Holding the file once would be 50 MiB, its base64 67 MiB.
	if live > 24<<20 {
		t.Errorf("live heap grew by %d MiB while reading a 50 MB file, want a bounded few pages (< 24 MiB)", live>>20)
	}

	// Changed under a paged read: the client has 1 MiB of content when the
	// file is replaced; the rest of the response must not complete.
	replaced := false
	_, n, _, err = readFileStreaming(t, base+"/file?path=fifty.bin&encoding=base64", func() {
		if resp := do(t, "POST", base, map[string]any{"write": []map[string]any{{"path": "fifty.bin", "content": "replaced"}}}, nil); resp.Status != http.StatusOK {
			t.Errorf("replace fifty.bin = %d %s", resp.Status, resp.Body)
		}
		replaced = true
	})
	if !replaced || err == nil {
		t.Fatalf("read of a file replaced mid-read ended after %d bytes with err %v, want a cut transfer (unexpected EOF)", n, err)
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Logf("cut read ended with %v after %d bytes", err, n)
	}
	if n >= 50<<20 {
		t.Fatalf("read of a file replaced mid-read delivered all %d bytes", n)
	}
	resp = do(t, "GET", base+"/file?path=fifty.bin", nil, nil)
	if resp.Status != http.StatusOK || string(resp.Body) != `{"content":"replaced","size":8}` {
		t.Fatalf("read after replace = %d %s, want the new content", resp.Status, resp.Body)
	}
}

// A 12,000-file tree, written in one change set, lists complete and
// sorted with correct hashes; the change set and the tree both cross the
// bus in pages.
func TestWorkspaceTreeTwelveThousand(t *testing.T) {
	r := watchRunner(t, nil)
	id, ws := startBigWorkspace(t, r)
	base := r.URL + "/v1/sessions/" + id + "/workspace"

	const n = 12_000
	want := map[string]string{}
	var writes []map[string]any
	for i := 0; i < n; i++ {
		// Mixed depths and names whose byte order differs from walk order.
		p := fmt.Sprintf("src/m%02d/file-%05d.ts", i%37, i)
		if i%5 == 0 {
			p = fmt.Sprintf("src/m%02d-x/f%d", i%37, i)
		}
		c := fmt.Sprintf("export const v%d = %d;\n", i, i*i)
		want[p] = sha([]byte(c))
		writes = append(writes, map[string]any{"path": p, "content": c})
	}
	start := time.Now()
	resp := do(t, "POST", base, map[string]any{"write": writes}, nil)
	if resp.Status != http.StatusOK || string(resp.Body) != fmt.Sprintf(`{"written":%d,"deleted":0}`, n) {
		t.Fatalf("POST %d files = %d %s", n, resp.Status, resp.Body)
	}
	t.Logf("wrote %d files in one change set in %v", n, time.Since(start).Round(time.Millisecond))
	want["telo.yaml"] = hashOnDisk(t, filepath.Join(ws, "telo.yaml"))
	want["telo-workspace.yaml"] = hashOnDisk(t, filepath.Join(ws, "telo-workspace.yaml")) // 9.7

	start = time.Now()
	resp = do(t, "GET", base, nil, nil)
	if resp.Status != http.StatusOK {
		t.Fatalf("GET tree = %d %s", resp.Status, resp.Body)
	}
	var tree struct {
		Files []struct{ Path, Hash string } `json:"files"`
	}
	resp.json(t, &tree)
	t.Logf("listed %d files (%d KB of JSON) in %v", len(tree.Files), len(resp.Body)>>10, time.Since(start).Round(time.Millisecond))
	for _, f := range tree.Files {
		if want[f.Path] != f.Hash {
			t.Errorf("tree has %s with hash %s, want %q", f.Path, f.Hash, want[f.Path])
		}
	}
	if len(tree.Files) != len(want) {
		t.Fatalf("tree lists %d files, want %d", len(tree.Files), len(want))
	}
	if !sort.SliceIsSorted(tree.Files, func(i, j int) bool { return tree.Files[i].Path < tree.Files[j].Path }) {
		t.Fatal("tree is not sorted by path in byte order")
	}
	for i := 1; i < len(tree.Files); i++ {
		if tree.Files[i].Path == tree.Files[i-1].Path {
			t.Fatalf("tree lists %s twice", tree.Files[i].Path)
		}
	}
}

func hashOnDisk(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha(b)
}

// A POST …/workspace body over RUNNER_WORKSPACE_MAX_BODY_BYTES answers 413
// payload_too_large naming the limit at once, declared length or not,
// and changes nothing; other routes keep the 1 MiB limit of 2.1.
func TestWorkspaceBodyLimit(t *testing.T) {
	r := watchRunner(t, map[string]string{"RUNNER_WORKSPACE_MAX_BODY_BYTES": "2097152"})
	id, ws := startBigWorkspace(t, r)
	url := r.URL + "/v1/sessions/" + id + "/workspace"
	big := `{"write":[{"path":"big.txt","content":"` + strings.Repeat("x", 3<<20) + `"}]}`

	for _, tc := range []struct {
		name    string
		chunked bool
	}{{"declared length", false}, {"chunked", true}} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader = strings.NewReader(big)
			if tc.chunked {
				body = io.MultiReader(body) // hides the length: sent chunked
			}
			req, _ := http.NewRequest("POST", url, body)
			req.Header.Set("Content-Type", "application/json")
			start := time.Now()
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("POST: %v", err)
			}
			data, _ := io.ReadAll(res.Body)
			res.Body.Close()
			took := time.Since(start)
			var e struct{ Error, Message string }
			_ = json.Unmarshal(data, &e)
			if res.StatusCode != http.StatusRequestEntityTooLarge || e.Error != "payload_too_large" || !strings.Contains(e.Message, "2097152") {
				t.Fatalf("POST 3 MiB = %d %s, want 413 payload_too_large naming 2097152", res.StatusCode, data)
			}
			if took > 5*time.Second {
				t.Fatalf("413 took %v, want an answer at once", took)
			}
			if _, err := os.Stat(filepath.Join(ws, "big.txt")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("big.txt exists after a refused body (%v)", err)
			}
		})
	}
	// Under the workspace limit but over 2.1's 1 MiB: accepted here only.
	ok := `{"write":[{"path":"ok.txt","content":"` + strings.Repeat("y", 1<<20+10) + `"}]}`
	if resp := do(t, "POST", url, ok, nil); resp.Status != http.StatusOK {
		t.Fatalf("POST 1 MiB + 10 = %d %s, want 200", resp.Status, resp.Body)
	}
	if resp := do(t, "PUT", r.URL+"/v1/sessions/"+id+"/apps", ok, nil); resp.Status != http.StatusRequestEntityTooLarge {
		t.Fatalf("PUT apps with 1 MiB + 10 = %d, want 413 (RUNNER_BODY_LIMIT_BYTES)", resp.Status)
	}
}
