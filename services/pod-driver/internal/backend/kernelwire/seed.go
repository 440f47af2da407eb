package kernelwire

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/merkle"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// Seeding bounds (contract 9.5 seeds one workspace; these split it).
const (
	// MaxRequestBytes is the workspace server's request body limit
	// (wsserver.MaxBodyBytes): no change set is larger. One file whose
	// base64 content alone is larger cannot be seeded.
	MaxRequestBytes = 64 << 20
	// DefaultChunkBytes bounds the encoded content of one seeding change
	// set (a single larger file travels alone).
	DefaultChunkBytes = 4 << 20
	// DefaultInFlight is how many change sets are posted at once.
	DefaultInFlight = 3
	// DefaultFetches is how many blobs are fetched at once: fetching a
	// small blob is mostly round trips, so many run in parallel...
	DefaultFetches = 16
	// DefaultFetchBytes is how many bytes of fetched blobs (by their
	// manifest size) may wait for a change set at once: ...while their
	// bytes stay bounded (a larger blob is fetched alone).
	DefaultFetchBytes = 16 << 20
	// budgetUnit is the granularity of the fetch byte budget.
	budgetUnit = 64 << 10
	// writeOverhead approximates the JSON around one write's content.
	writeOverhead = 96
)

// Seed is what seeds a fresh workspace: bundle files carried inline, or a
// checkpoint's files named by content hash and fetched while seeding.
// Build one with BundleSeed or RestoreSeed.
type Seed struct {
	items []seedItem
	fetch func(ctx context.Context, hash string) ([]byte, error)
}

// seedItem is one file of a Seed: inline (a bundle file) or by hash.
type seedItem struct {
	path   string
	mode   uint32
	hash   string
	size   int64
	inline *Write
}

// BundleSeed is the seed of a bundle (create): SeedChanges' writes, the
// marker included, checked the same way.
func BundleSeed(files []contract.BundleFile) (Seed, error) {
	cs, err := SeedChanges(files)
	if err != nil {
		return Seed{}, err
	}
	s := Seed{items: make([]seedItem, len(cs.Write))}
	for i := range cs.Write {
		s.items[i] = seedItem{path: cs.Write[i].Path, inline: &cs.Write[i]}
	}
	return s, nil
}

// RestoreSeed is the seed of a checkpoint (resume, app-set change): every
// file by hash, then the marker unless the checkpoint has one. It fails on
// a path that does not normalize, a path listed twice or a hash that is
// not 64 hex digits, before anything is written.
func RestoreSeed(r backend.Restore) (Seed, error) {
	if r.Fetch == nil {
		return Seed{}, errors.New("restore: no blob source")
	}
	s := Seed{items: make([]seedItem, 0, len(r.Files)+1), fetch: r.Fetch}
	seen := make(map[string]bool, len(r.Files))
	for _, f := range r.Files {
		rel, err := contract.NormalizePath(f.Path)
		if err != nil {
			return Seed{}, fmt.Errorf("restore %q: %w", f.Path, err)
		}
		if seen[rel] {
			return Seed{}, fmt.Errorf("restore: %s listed twice", rel)
		}
		seen[rel] = true
		h := strings.ToLower(f.Hash)
		if !merkle.ValidHash(h) {
			return Seed{}, fmt.Errorf("restore %s: hash %q is not 64 hex digits", rel, f.Hash)
		}
		s.items = append(s.items, seedItem{path: rel, mode: f.Mode, hash: h, size: f.Size})
	}
	if !seen[MarkerPath] {
		s.items = append(s.items, seedItem{path: MarkerPath, inline: &Write{Path: MarkerPath, Content: MarkerContent, Encoding: "utf8"}})
	}
	return s, nil
}

// SpecSeed is the seed of a watch spec: its Restore when set, else its
// bundle.
func SpecSeed(spec backend.Spec) (Seed, error) {
	if spec.Restore != nil {
		return RestoreSeed(*spec.Restore)
	}
	return BundleSeed(spec.Bundle.Files)
}

// SeedOptions tune Seed; zero fields take the defaults above.
type SeedOptions struct {
	ChunkBytes int // encoded content per change set
	InFlight   int // change sets posted at once
	Fetches    int // blobs fetched at once
	FetchBytes int // bytes of fetched blobs waiting to be packed, at most
	// Last are paths written after every other file (the apps' entries),
	// so a kernel waiting for its entry (10.1) starts on a complete
	// workspace. The marker is always written last of all: a workspace
	// that has it was seeded completely (the local backend's recovery
	// relies on that).
	Last []string
}

// SeedStats is what one Seed did.
type SeedStats struct {
	Files         int           // paths in the seed, the marker included
	Written       int           // paths written
	Unchanged     int           // paths that already held their content
	Deleted       int           // paths the workspace held and the seed lacks (and its old marker)
	Fetched       int           // distinct blobs fetched from the seed's source
	FetchedBytes  int64         // their bytes
	FromWorkspace int           // distinct blobs read back from the workspace, which held them
	Staged        int           // paths staged in chunks (larger than StageAbove)
	Bytes         int64         // content bytes written
	ChangeSets    int           // change sets posted
	Fetch         time.Duration // time spent in fetches, summed (they overlap)
	Post          time.Duration // time spent posting change sets, summed (they overlap)
	Took          time.Duration // the whole seed
}

// blobGroup is one distinct content of a seed and every path it goes to.
type blobGroup struct {
	hash    string
	units   int // of the fetch budget this blob takes
	paths   []seedItem
	present bool // the workspace already holds this content somewhere
}

// seedWrite is one write of a seed: w as is, or, with raw set, w's
// content is raw in base64, encoded only into the request body.
type seedWrite struct {
	w   Write
	raw []byte
}

// encodedLen is the length of the write's content on the wire.
func (s seedWrite) encodedLen() int {
	if s.raw != nil {
		return base64.StdEncoding.EncodedLen(len(s.raw))
	}
	return len(s.w.Content)
}

// decodedLen is the byte length of the write's content once written.
func (s seedWrite) decodedLen() int {
	switch {
	case s.raw != nil:
		return len(s.raw)
	case s.w.Encoding == "base64":
		n, _ := base64.StdEncoding.Decode(make([]byte, base64.StdEncoding.DecodedLen(len(s.w.Content))), []byte(s.w.Content))
		return n
	}
	return len(s.w.Content)
}

// encodeChangeSet is the body of POST /workspace writing ws: raw contents
// go straight into it as base64, with no intermediate string.
func encodeChangeSet(ws []seedWrite) ([]byte, error) {
	size := 16
	for _, w := range ws {
		size += w.encodedLen() + len(w.w.Path) + writeOverhead
	}
	buf := bytes.NewBuffer(make([]byte, 0, size))
	buf.WriteString(`{"write":[`)
	for i, w := range ws {
		if i > 0 {
			buf.WriteByte(',')
		}
		if w.raw == nil {
			b, err := json.Marshal(w.w)
			if err != nil {
				return nil, err
			}
			buf.Write(b)
			continue
		}
		path, err := json.Marshal(w.w.Path)
		if err != nil {
			return nil, err
		}
		buf.WriteString(`{"path":`)
		buf.Write(path)
		buf.WriteString(`,"content":"`)
		n := buf.Len()
		buf.Write(make([]byte, base64.StdEncoding.EncodedLen(len(w.raw))))
		base64.StdEncoding.Encode(buf.Bytes()[n:], w.raw)
		buf.WriteString(`","encoding":"base64"`)
		if w.w.Mode != 0 {
			buf.WriteString(`,"mode":` + strconv.FormatUint(uint64(w.w.Mode), 10))
		}
		buf.WriteByte('}')
	}
	buf.WriteString(`]}`)
	return buf.Bytes(), nil
}

type fetchedBlob struct {
	g    *blobGroup
	data []byte
}

// Seed writes s into the workspace in change sets of at most
// opts.ChunkBytes of encoded content (a larger file alone), opts.InFlight
// at once, while opts.Fetches blobs are fetched: memory holds a bounded
// number of blobs and change sets, never the workspace. Each distinct
// hash is fetched once, whatever the number of paths holding it. A
// workspace that is not empty ends up equal to the seed: what the seed
// lacks is deleted first (with the workspace's marker), a path that
// already holds its content is left alone, and content such a path holds
// is read back from the workspace (GET /workspace/blob/{hash}) rather than
// fetched for the other paths that want it. Files of opts.Last, then the
// marker, are written after everything else. The first failure stops the
// seed; what was written stays (with no marker).
func (c WorkspaceClient) Seed(ctx context.Context, s Seed, opts SeedOptions) (SeedStats, error) {
	start := time.Now()
	opts = opts.withDefaults()
	st := SeedStats{Files: len(s.items)}
	present, err := c.Tree(ctx)
	if err != nil {
		return st, fmt.Errorf("seed: %w", err)
	}
	atPath := make(map[string]string, len(present))
	for _, f := range present {
		atPath[f.Path] = f.Hash
	}
	inSeed := make(map[string]bool, len(s.items))
	for _, it := range s.items {
		inSeed[it.path] = true
	}
	// A workspace that is not empty (a directory reused on this machine)
	// loses what the seed lacks, and its marker, first: should the seed
	// stop half way, no marker says it is complete.
	var deletes []string
	for _, f := range present {
		if !inSeed[f.Path] || f.Path == MarkerPath {
			deletes = append(deletes, f.Path)
			delete(atPath, f.Path)
		}
	}
	if err := c.deleteAll(ctx, deletes, opts.ChunkBytes); err != nil {
		return st, fmt.Errorf("seed: %w", err)
	}
	st.Deleted = len(deletes)
	last := make(map[string]bool, len(opts.Last)+1)
	for _, p := range opts.Last {
		if rel, err := contract.NormalizePath(p); err == nil {
			last[rel] = true
		}
	}
	last[MarkerPath] = true

	var inline []seedWrite
	var groups []*blobGroup
	byHash := map[string]*blobGroup{}
	var final []seedWrite // writes of last paths, posted at the end
	for _, it := range s.items {
		switch {
		case it.inline != nil && last[it.path]:
			final = append(final, seedWrite{w: *it.inline})
		case it.inline != nil:
			inline = append(inline, seedWrite{w: *it.inline})
		case atPath[it.path] == it.hash:
			st.Unchanged++
		default:
			g := byHash[it.hash]
			if g == nil {
				g = &blobGroup{hash: it.hash, units: units(it.size, opts.FetchBytes)}
				byHash[it.hash] = g
				groups = append(groups, g)
			}
			g.paths = append(g.paths, it)
		}
	}
	// Content the workspace holds at a path the seed leaves alone can be
	// read back from it (a path being rewritten might change under the
	// read).
	held := make(map[string]bool, st.Unchanged)
	for _, it := range s.items {
		if it.inline == nil && atPath[it.path] == it.hash {
			held[it.hash] = true
		}
	}
	for _, g := range groups {
		g.present = held[g.hash]
	}
	if len(groups) > 0 && s.fetch == nil {
		return st, errors.New("seed: files by hash and no blob source")
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var fetchNS, postNS atomic.Int64
	var fetched, fetchedBytes, fromWS, written, sets, bytesW, staged atomic.Int64

	post := func(cs []seedWrite) error {
		t0 := time.Now()
		body, err := encodeChangeSet(cs)
		if err == nil {
			err = c.apply(ctx, body, len(cs), 0)
		}
		postNS.Add(int64(time.Since(t0)))
		if err != nil {
			return err
		}
		sets.Add(1)
		written.Add(int64(len(cs)))
		for _, w := range cs {
			bytesW.Add(int64(w.decodedLen()))
		}
		return nil
	}

	// Posters.
	setCh := make(chan []seedWrite)
	var posters sync.WaitGroup
	for range opts.InFlight {
		posters.Go(func() {
			for cs := range setCh {
				if err := post(cs); err != nil {
					cancel(err)
					for range setCh { // drain: the packer stops at the cancel
					}
					return
				}
			}
		})
	}

	// Fetchers.
	jobs := make(chan *blobGroup)
	blobs := make(chan fetchedBlob)
	var fetchers sync.WaitGroup
	for range min(opts.Fetches, max(len(groups), 1)) {
		fetchers.Go(func() {
			for g := range jobs {
				t0 := time.Now()
				var data []byte
				var err error
				if g.present {
					data, err = c.Blob(ctx, g.hash)
					fromWS.Add(1)
				} else {
					data, err = s.fetch(ctx, g.hash)
					fetched.Add(1)
					fetchedBytes.Add(int64(len(data)))
				}
				fetchNS.Add(int64(time.Since(t0)))
				if err != nil {
					cancel(fmt.Errorf("fetch %s (%s): %w", g.hash, g.paths[0].path, err))
					return
				}
				select {
				case blobs <- fetchedBlob{g, data}:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	// The fetch budget: this one goroutine takes a blob's units before
	// handing it to a fetcher, the packer gives them back once the blob's
	// writes are packed.
	budget := make(chan struct{}, units(int64(opts.FetchBytes), opts.FetchBytes))
	go func() {
		defer close(jobs)
		for _, g := range groups {
			for range g.units {
				select {
				case budget <- struct{}{}:
				case <-ctx.Done():
					return
				}
			}
			select {
			case jobs <- g:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() {
		fetchers.Wait()
		close(blobs)
	}()

	// Packer: this goroutine.
	p := packer{chunk: opts.ChunkBytes, out: func(cs []seedWrite) bool {
		select {
		case setCh <- cs:
			return true
		case <-ctx.Done():
			return false
		}
	}}
	for _, w := range inline {
		if err := p.add(w); err != nil {
			cancel(err)
			break
		}
	}
	for fb := range blobs {
		for range fb.g.units {
			<-budget
		}
		if ctx.Err() != nil {
			continue // drain: the fetchers stop at the cancel
		}
		for _, it := range fb.g.paths {
			w := seedWrite{w: Write{Path: it.path, Encoding: "base64", Mode: it.mode}, raw: fb.data}
			if len(fb.data) > StageAbove {
				// Too large for one request (or worth not holding twice):
				// staged in chunks, committed whole by its change set.
				id, err := c.stage(ctx, it.path, fb.data)
				if err != nil {
					cancel(err)
					break
				}
				staged.Add(1)
				w = seedWrite{w: Write{Path: it.path, Encoding: "utf8", Mode: it.mode, Staged: id}}
			}
			if last[it.path] {
				final = append(final, w)
				continue
			}
			if err := p.add(w); err != nil {
				cancel(err)
				break
			}
		}
	}
	if ctx.Err() == nil {
		if err := p.flush(); err != nil {
			cancel(err)
		}
	}
	close(setCh)
	posters.Wait()
	st.Fetched, st.FetchedBytes, st.FromWorkspace = int(fetched.Load()), fetchedBytes.Load(), int(fromWS.Load())
	st.Staged = int(staged.Load())
	collect := func() {
		st.Written, st.ChangeSets, st.Bytes = int(written.Load()), int(sets.Load()), bytesW.Load()
		st.Fetch, st.Post, st.Took = time.Duration(fetchNS.Load()), time.Duration(postNS.Load()), time.Since(start)
	}
	if err := context.Cause(ctx); err != nil {
		collect()
		return st, fmt.Errorf("seed: %w", err)
	}

	// The last paths, in order, the marker at the very end.
	slices.SortStableFunc(final, func(a, b seedWrite) int {
		switch {
		case a.w.Path == MarkerPath && b.w.Path != MarkerPath:
			return 1
		case b.w.Path == MarkerPath && a.w.Path != MarkerPath:
			return -1
		}
		return strings.Compare(a.w.Path, b.w.Path)
	})
	fp := packer{chunk: opts.ChunkBytes, out: func(cs []seedWrite) bool {
		if err := post(cs); err != nil {
			cancel(err)
			return false
		}
		return true
	}}
	for _, w := range final {
		if err := fp.add(w); err != nil {
			cancel(err)
			break
		}
	}
	if ctx.Err() == nil {
		if err := fp.flush(); err != nil {
			cancel(err)
		}
	}
	collect()
	if err := context.Cause(ctx); err != nil {
		return st, fmt.Errorf("seed: %w", err)
	}
	return st, nil
}

func (o SeedOptions) withDefaults() SeedOptions {
	if o.ChunkBytes <= 0 {
		o.ChunkBytes = DefaultChunkBytes
	}
	o.ChunkBytes = min(o.ChunkBytes, MaxRequestBytes/2)
	if o.InFlight <= 0 {
		o.InFlight = DefaultInFlight
	}
	if o.Fetches <= 0 {
		o.Fetches = DefaultFetches
	}
	if o.FetchBytes <= 0 {
		o.FetchBytes = DefaultFetchBytes
	}
	return o
}

// units is how much of a budget of limit bytes a blob of size bytes
// takes: at least one unit, at most the whole budget.
func units(size int64, limit int) int {
	total := max(1, limit/budgetUnit)
	return int(min(max(1, (size+budgetUnit-1)/budgetUnit), int64(total)))
}

// A file of more than StageAbove bytes is staged in chunks of StageChunk
// (POST /workspace/stage) and committed by name in its change set, so no
// request carries it whole and a file larger than the request limit seeds.
const (
	StageAbove = 16 << 20
	StageChunk = 8 << 20
)

// stage uploads data for path in chunks and returns the upload's id.
func (c WorkspaceClient) stage(ctx context.Context, path string, data []byte) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	id := hex.EncodeToString(b[:])
	api := c.api()
	for off := 0; ; off += StageChunk {
		end := min(off+StageChunk, len(data))
		if _, err := api.Stage(ctx, id, path, int64(off), data[off:end]); err != nil {
			return "", fmt.Errorf("stage %s: %w", path, err)
		}
		if end == len(data) {
			return id, nil
		}
	}
}

// errStopped is a packer's output refusing a change set (the seed was
// cancelled; the cause is the context's).
var errStopped = errors.New("seed stopped")

// packer groups writes into change sets of at most chunk encoded bytes (a
// larger write alone) and hands each full one to out.
type packer struct {
	chunk int
	cur   []seedWrite
	size  int
	out   func([]seedWrite) bool
}

func (p *packer) add(w seedWrite) error {
	n := w.encodedLen() + len(w.w.Path) + writeOverhead
	if n > MaxRequestBytes-4096 {
		return fmt.Errorf("file %s: %d bytes encoded, over the %d-byte limit of one workspace server request", w.w.Path, w.encodedLen(), MaxRequestBytes)
	}
	if len(p.cur) > 0 && p.size+n > p.chunk {
		if err := p.flush(); err != nil {
			return err
		}
	}
	p.cur = append(p.cur, w)
	p.size += n
	return nil
}

func (p *packer) flush() error {
	if len(p.cur) == 0 {
		return nil
	}
	cs := p.cur
	p.cur, p.size = nil, 0
	if !p.out(cs) {
		return errStopped
	}
	return nil
}

// deleteAll deletes paths in change sets of about chunk bytes of paths.
func (c WorkspaceClient) deleteAll(ctx context.Context, paths []string, chunk int) error {
	for len(paths) > 0 {
		n, size := 0, 0
		for n < len(paths) && (n == 0 || size+len(paths[n])+4 <= chunk) {
			size += len(paths[n]) + 4
			n++
		}
		if err := c.Apply(ctx, ChangeSet{Write: []Write{}, Delete: paths[:n]}); err != nil {
			return err
		}
		paths = paths[n:]
	}
	return nil
}

// Tree lists the workspace's files with their hashes.
func (c WorkspaceClient) Tree(ctx context.Context) ([]TreeFile, error) {
	t, err := c.api().Tree(ctx)
	return t.Files, err
}

// Blob reads the content of a workspace file whose hash is hash (GET
// /workspace/blob/{hash}), checked against it.
func (c WorkspaceClient) Blob(ctx context.Context, hash string) ([]byte, error) {
	return c.api().Blob(ctx, hash)
}
