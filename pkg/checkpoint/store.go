package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/parallel"
)

// File is one regular file of a workspace tree.
type File struct {
	Path string
	Hash string // Hex SHA-256 of the bytes.
}

// Workspace is the live workspace a checkpoint is taken from.
type Workspace interface {
	// Tree lists every file with its hash.
	Tree(ctx context.Context) ([]File, error)
	// Blob returns the bytes of a file whose hash is hash.
	Blob(ctx context.Context, hash string) ([]byte, error)
}

// Stats counts what one Take did.
type Stats struct {
	Files         int   // Files in the new manifest.
	Changed       int   // Paths new or with new content since the last manifest.
	Removed       int   // Paths of the last manifest no longer present.
	Uploaded      int   // Blobs fetched from the workspace and stored.
	BytesUploaded int64 // Their bytes.
	BytesTotal    int64 // Bytes of every file in the new manifest.
}

// Options configure a Store. Zero fields take defaults.
type Options struct {
	// Concurrency bounds blob transfers in flight per call (default 4).
	Concurrency int
	// Grace is how old an unreferenced object must be before
	// CollectGarbage deletes it, and how long a Take may run (default 10
	// minutes).
	Grace time.Duration
	// InlineLimit is the largest encoded file map stored inline in the
	// key-value value, in bytes (default 256 KiB).
	InlineLimit int
	// Now is the clock (default time.Now).
	Now func() time.Time
	// History is how many checkpoints of a session are kept
	// (RUNNER_CHECKPOINT_HISTORY, default 64).
	History int
}

// Validate reports the first invalid option.
func (o Options) Validate() error {
	switch {
	case o.Concurrency < 0:
		return fmt.Errorf("concurrency %d: must not be negative", o.Concurrency)
	case o.Grace < 0:
		return fmt.Errorf("grace %v: must not be negative", o.Grace)
	case o.InlineLimit < 0:
		return fmt.Errorf("inline limit %d: must not be negative", o.InlineLimit)
	case o.History < 0 || o.History > MaxHistory:
		return fmt.Errorf("history %d: must be between 1 and %d", o.History, MaxHistory)
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.Concurrency == 0 {
		o.Concurrency = 4
	}
	if o.Grace == 0 {
		o.Grace = 10 * time.Minute
	}
	if o.InlineLimit == 0 {
		o.InlineLimit = 256 << 10
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.History == 0 {
		o.History = DefaultHistory
	}
	return o
}

// Store keeps checkpoints in runner_blobs and runner_checkpoints. It is
// safe for concurrent use and holds no state of its own.
type Store struct {
	blobs jetstream.ObjectStore
	kv    jetstream.KeyValue
	opts  Options
}

// NewStore binds to the provisioned object store and bucket (bus.Provision).
func NewStore(ctx context.Context, js jetstream.JetStream, opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	blobs, err := js.ObjectStore(ctx, bus.ObjectBlobs)
	if err != nil {
		return nil, fmt.Errorf("open object store %s: %w", bus.ObjectBlobs, err)
	}
	kv, err := js.KeyValue(ctx, bus.BucketCheckpoints)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", bus.BucketCheckpoints, err)
	}
	return &Store{blobs: blobs, kv: kv, opts: opts.withDefaults()}, nil
}

// Take checkpoints ws as the session's new manifest and returns it. Only
// content the store lacks is read from ws and uploaded; unchanged files
// move no bytes. On any error (including ErrConflict when another Take of
// the session finished first) the previous manifest stays as it was;
// blobs already uploaded are left for a later Take or the collector.
func (s *Store) Take(ctx context.Context, sessionID string, ws Workspace) (Manifest, Stats, error) {
	return s.TakeAs(ctx, sessionID, ReasonPeriodic, ws)
}

// TakeAs is Take recording reason (ReasonPeriodic, ReasonSuspend, ...) in
// the session's history. The new checkpoint becomes the newest entry of
// the history, which keeps Options.History entries. A periodic Take of a
// tree equal to the latest checkpoint's writes nothing and returns the
// latest (its ID, its TakenAt).
func (s *Store) TakeAs(ctx context.Context, sessionID, reason string, ws Workspace) (Manifest, Stats, error) {
	var st Stats
	if !ValidReason(reason) {
		return Manifest{}, st, fmt.Errorf("checkpoint: unknown reason %q", reason)
	}
	if !contract.ValidSessionID(sessionID) {
		return Manifest{}, st, fmt.Errorf("checkpoint: invalid session id %q", sessionID)
	}
	start := s.opts.Now()
	prev, prevRec, rev, err := s.load(ctx, sessionID)
	if err != nil {
		return Manifest{}, st, err
	}
	tree, err := ws.Tree(ctx)
	if err != nil {
		return Manifest{}, st, fmt.Errorf("read workspace tree: %w", err)
	}
	known := make(map[string]int64, len(prev.Files)) // Hash → size, held by the store.
	for _, e := range prev.Files {
		known[e.Hash] = e.Size
	}
	next := Manifest{TakenAt: start.UTC(), Files: make(map[string]Entry, len(tree))}
	var missing []string // Hashes to look up, each once.
	for _, f := range tree {
		h, ok := normalHash(f.Hash)
		if !ok || f.Path == "" {
			return Manifest{}, st, fmt.Errorf("workspace tree: bad entry %q (hash %q)", f.Path, f.Hash)
		}
		if _, dup := next.Files[f.Path]; dup {
			return Manifest{}, st, fmt.Errorf("workspace tree: %q listed twice", f.Path)
		}
		next.Files[f.Path] = Entry{Hash: h}
		if old, ok := prev.Files[f.Path]; !ok || old.Hash != h {
			st.Changed++
		}
		if _, ok := known[h]; !ok {
			known[h] = -1
			missing = append(missing, h)
		}
	}
	for p := range prev.Files {
		if _, ok := next.Files[p]; !ok {
			st.Removed++
		}
	}

	sizes := make([]int64, len(missing))
	uploaded := make([]bool, len(missing))
	err = parallel.Do(ctx, len(missing), s.opts.Concurrency, func(ctx context.Context, i int) error {
		var err error
		sizes[i], uploaded[i], err = s.ensureBlob(ctx, ws, missing[i])
		return err
	})
	if err != nil {
		return Manifest{}, st, err
	}
	for i, h := range missing {
		known[h] = sizes[i]
		if uploaded[i] {
			st.Uploaded++
			st.BytesUploaded += sizes[i]
		}
	}
	for p, e := range next.Files {
		e.Size = known[e.Hash]
		next.Files[p] = e
		st.BytesTotal += e.Size
	}
	st.Files = len(next.Files)

	if reason == ReasonPeriodic && rev != 0 && prevRec.ID != "" && st.Changed == 0 && st.Removed == 0 {
		// Nothing changed since the latest checkpoint: a tick adds no
		// history entry (the history holds changes, not ticks).
		prev.ID = prevRec.ID
		return prev, st, nil
	}
	if took := s.opts.Now().Sub(start); took >= s.opts.Grace {
		return Manifest{}, st, fmt.Errorf("checkpoint %s: took %v, longer than the %v grace period of its uploads", sessionID, took, s.opts.Grace)
	}
	id, err := s.write(ctx, sessionID, next, reason, st.BytesTotal, prevRec, rev)
	if err != nil {
		return Manifest{}, st, err
	}
	next.ID = id
	return next, st, nil
}

// ensureBlob makes sure the store holds the blob hash, fetching it from ws
// when it does not, and returns its size and whether it was uploaded.
func (s *Store) ensureBlob(ctx context.Context, ws Workspace, hash string) (int64, bool, error) {
	name := bus.BlobKey(hash)
	info, err := s.adopt(ctx, name)
	if err != nil {
		return 0, false, err
	}
	if info != nil {
		return int64(info.Size), false, nil
	}
	data, err := ws.Blob(ctx, hash)
	if err != nil {
		return 0, false, fmt.Errorf("read workspace blob %s: %w", hash, err)
	}
	if sha256Hex(data) != hash {
		return 0, false, fmt.Errorf("workspace blob %s: content does not match its hash", hash)
	}
	ctx, cancel := bus.ObjectContext(ctx)
	defer cancel()
	if _, err := s.blobs.PutBytes(ctx, name, data); err != nil {
		return 0, false, fmt.Errorf("put %s: %w", name, err)
	}
	return int64(len(data)), true, nil
}

// blob returns the stored bytes of hash, checked against it.
func (s *Store) blob(ctx context.Context, hash string) ([]byte, error) {
	ctx, cancel := bus.ObjectContext(ctx)
	defer cancel()
	data, err := s.blobs.GetBytes(ctx, bus.BlobKey(hash))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("blob %s: %w", hash, ErrMissingBlob)
	}
	if err != nil {
		return nil, fmt.Errorf("get blob %s: %w", hash, err)
	}
	if sha256Hex(data) != hash {
		return nil, fmt.Errorf("blob %s: content does not match its hash", hash)
	}
	return data, nil
}
