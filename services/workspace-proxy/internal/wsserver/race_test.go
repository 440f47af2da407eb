package wsserver_test

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/telorunner/telorunner/pkg/wsapi"
)

// The symlink checks are policy; os.Root is the boundary. Here a directory
// is swapped with a link to the sentinel while requests go through it, so
// some requests pass the checks and then meet the link. Nothing outside
// may change and no read may return the sentinel's bytes.
func TestSymlinkSwapRace(t *testing.T) {
	sb := newSandbox(t)
	writeFiles(t, sb.root, map[string]string{"d/secret": "inside copy\n"})
	if err := os.Symlink("../outside", filepath.Join(sb.root, "dlink")); err != nil {
		t.Fatal(err)
	}
	before := sb.describe(t)
	f := start(t, sb.root, nil)

	d, real, link := filepath.Join(sb.root, "d"), filepath.Join(sb.root, "d.real"), filepath.Join(sb.root, "dlink")
	ctx, cancel := context.WithCancel(t.Context())
	var swapper sync.WaitGroup
	swapper.Go(func() {
		for ctx.Err() == nil {
			// d → link to the sentinel ...
			if os.Rename(d, real) != nil {
				continue
			}
			if os.Rename(link, d) == nil {
				_ = os.Rename(d, link) // ... and back.
			}
			if fi, err := os.Lstat(d); err == nil && fi.IsDir() {
				_ = os.RemoveAll(d) // A request re-created d meanwhile; a real directory inside the root.
			}
			_ = os.Rename(real, d)
		}
	})

	var clients sync.WaitGroup
	for w := range 3 {
		clients.Go(func() {
			for range 300 {
				switch w {
				case 0:
					_, _ = f.c.Apply(ctx, wsapi.ChangeSet{Write: []wsapi.WriteOp{
						{Path: "d/secret", Content: "pwned"}, {Path: "d/new/deep", Content: "pwned"}}})
				case 1:
					_, _ = f.c.Apply(ctx, wsapi.ChangeSet{Delete: []string{"d/secret", "d/d", "d/new"}})
				default:
					file, err := f.c.Read(ctx, "d/secret", wsapi.EncodingBase64)
					if err == nil {
						if b, _ := base64.StdEncoding.DecodeString(file.Content); string(b) == "top secret\n" {
							t.Errorf("Read(d/secret) returned the sentinel outside the root")
						}
					}
					_, _ = f.c.Touch(ctx, []string{"d/secret"}) // Inside is fine; the sentinel check catches an escape.
					if _, err := f.c.Snapshot(ctx); err != nil {
						t.Errorf("Snapshot() = %v", err)
					}
				}
			}
		})
	}
	clients.Wait()
	cancel()
	swapper.Wait()
	sb.assertUnchanged(t, before)
}
