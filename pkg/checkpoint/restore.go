package checkpoint

import (
	"context"
	"iter"
	"maps"
	"slices"

	"github.com/telorunner/telorunner/pkg/parallel"
)

// RestoreFile is one file of a manifest with its bytes.
type RestoreFile struct {
	Path    string
	Content []byte // Shared between files with the same content: read only.
	Mode    uint32 // Permission bits; 0 = unknown (give the default).
}

// Window bounds of Files: how much it holds in memory at once.
const (
	windowFiles = 64
	windowBytes = 8 << 20
)

// Files yields every file of m with its content, in path order, fetching
// from the store a window of files at a time (Options.Concurrency blobs
// in flight). A failure, such as ErrMissingBlob, is yielded once as the
// error and ends the sequence. Breaking out early is safe: no transfer
// outlives the call.
func (s *Store) Files(ctx context.Context, m Manifest) iter.Seq2[RestoreFile, error] {
	return func(yield func(RestoreFile, error) bool) {
		paths := slices.Sorted(maps.Keys(m.Files))
		for len(paths) > 0 {
			n, size := 0, int64(0)
			for n < len(paths) && n < windowFiles && (n == 0 || size+m.Files[paths[n]].Size <= windowBytes) {
				size += m.Files[paths[n]].Size
				n++
			}
			window := paths[:n]
			paths = paths[n:]
			content := make(map[string][]byte, n)
			var hashes []string
			for _, p := range window {
				if h := m.Files[p].Hash; !slices.Contains(hashes, h) {
					hashes = append(hashes, h)
				}
			}
			fetched := make([][]byte, len(hashes))
			err := parallel.Do(ctx, len(hashes), s.opts.Concurrency, func(ctx context.Context, i int) error {
				var err error
				fetched[i], err = s.blob(ctx, hashes[i])
				return err
			})
			if err != nil {
				yield(RestoreFile{}, err)
				return
			}
			for i, h := range hashes {
				content[h] = fetched[i]
			}
			for _, p := range window {
				e := m.Files[p]
				if !yield(RestoreFile{Path: p, Content: content[e.Hash], Mode: e.Mode}, nil) {
					return
				}
			}
		}
	}
}
