package e2e

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A workspace larger than the workspace server's 64 MiB request limit (80
// MiB in 40 files, two of them holding the same content, four of them
// executable) survives an idle
// suspend and its resume: the seed streams it in bounded change sets
// instead of one request the server refuses (which failed the session).
// The files are written straight into the workspace directory (the local
// backend's, on this machine), so the test does not depend on the size
// limits of the /v1 write path; the checkpoint reads them through the
// workspace server like any edit. After the resume the tree listing and
// every byte and mode on disk equal what was written.
func TestResumeWorkspaceOverRequestLimit(t *testing.T) {
	r := watchRunner(t, fastSupervisor)
	c := r.create(t, watchBody(map[string]string{"telo.yaml": manifest("large", nil, nil)}, []app{{Name: "app", Entry: "telo.yaml"}}, ""))
	id := c.SessionID
	awake := openSSE(t, r.URL+c.StreamURL, nil)
	waitStatus(t, r, id, "running", 60*time.Second)

	ws := filepath.Join(r.DataDir, "sessions", id, "workspace")
	rnd := rand.New(rand.NewPCG(15, 3))
	want := map[string][]byte{}
	modes := map[string]os.FileMode{}
	const files, size = 40, 2 << 20
	for i := range files {
		p := fmt.Sprintf("big/part-%02d.bin", i)
		data := make([]byte, size)
		for j := range data {
			data[j] = byte(rnd.Uint32())
		}
		if i == files-1 {
			data = want["big/part-00.bin"] // the same content at two paths
		}
		full := filepath.Join(ws, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if i%10 == 5 {
			mode = 0o755 // modes survive the cycle too
		}
		if err := os.WriteFile(full, data, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(full, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		want[p] = data
		modes[p] = mode
	}
	before := tree(t, r, id)
	awake.Close() // the idle window starts now

	waitStatus(t, r, id, "suspended", 3*time.Minute)
	if _, err := os.Stat(ws); !os.IsNotExist(err) {
		t.Fatalf("workspace directory still there after the suspend (stat: %v): the resume would not be a restore", err)
	}
	awake = openSSE(t, r.URL+"/v1/sessions/"+id+"/events", nil)
	defer awake.Close()
	if resp := do(t, "POST", r.URL+"/v1/sessions/"+id+"/resume", nil, nil); resp.Status != http.StatusAccepted {
		t.Fatalf("resume = %d %s", resp.Status, resp.Body)
	}
	waitStatus(t, r, id, "running", 3*time.Minute)
	if got := tree(t, r, id); got != before {
		t.Fatalf("tree after resume = %s, want %s", got, before)
	}
	for p, data := range want {
		got, err := os.ReadFile(filepath.Join(ws, filepath.FromSlash(p)))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s after resume: %d bytes (%v), want %d identical bytes", p, len(got), err, len(data))
		}
		fi, err := os.Stat(filepath.Join(ws, filepath.FromSlash(p)))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != modes[p] {
			t.Fatalf("%s after resume: mode %v, want %v", p, fi.Mode().Perm(), modes[p])
		}
	}
	// The app runs again on the restored workspace.
	awake.until(t, 60*time.Second, func(e sseEvent) bool {
		return e.Event == "run" && bytes.Contains([]byte(e.Data), []byte(`"trigger":"resume"`))
	})
}
