package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
)

// Workspace is the live workspace a checkpoint is taken from, served as
// a Merkle tree of directories (package merkle).
type Workspace interface {
	// Root walks the workspace and returns the canonical encoding of its
	// root node; the SHA-256 of those bytes is the root's hash.
	Root(ctx context.Context) ([]byte, error)
	// Node returns the encoding of a node below the root last returned.
	Node(ctx context.Context, hash string) ([]byte, error)
	// Blob returns the bytes of a file whose hash is hash.
	Blob(ctx context.Context, hash string) ([]byte, error)
}

// Stats counts what one Take did.
type Stats struct {
	Files         int   // Files in the new checkpoint.
	Changed       int   // Paths new, or with new content or mode, since the last checkpoint.
	Removed       int   // Paths of the last checkpoint no longer present.
	Uploaded      int   // Blobs fetched from the workspace and stored.
	BytesUploaded int64 // Their bytes.
	BytesTotal    int64 // Bytes of every file in the new checkpoint.
	NodesRead     int   // Tree nodes read from the workspace (the root included).
	NodesStored   int   // Tree nodes new to the store, written.
}

// Options configure a Store. Zero fields take defaults.
type Options struct {
	// Concurrency bounds blob transfers in flight per call (default 4).
	Concurrency int
	// Grace is how old an unreferenced object must be before
	// CollectGarbage deletes it, and how long a Take may run (default 10
	// minutes).
	Grace time.Duration
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
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.History == 0 {
		o.History = DefaultHistory
	}
	return o
}

// Store keeps checkpoints in runner_blobs and runner_checkpoints. It is
// safe for concurrent use; its only state is a bounded in-memory cache of
// tree nodes by hash (content-addressed, so never stale) and a handle of
// the object store's stream (for Blob).
type Store struct {
	blobs  jetstream.ObjectStore
	kv     jetstream.KeyValue
	opts   Options
	nodes  *nodeCache
	direct *directBlobs // Blob's one-chunk path (blob.go)
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
	return &Store{blobs: blobs, kv: kv, opts: opts.withDefaults(), nodes: newNodeCache(nodeCacheBytes), direct: &directBlobs{js: js}}, nil
}

// ensureBlob makes sure the store holds the blob hash, fetching it from ws
// when it does not, and reports whether it was uploaded. size is the size
// the workspace's tree gave the file; a blob of another size fails.
func (s *Store) ensureBlob(ctx context.Context, ws Workspace, hash string, size int64) (bool, error) {
	name := bus.BlobKey(hash)
	info, err := s.adopt(ctx, name)
	if err != nil {
		return false, err
	}
	if info != nil {
		if int64(info.Size) != size {
			return false, fmt.Errorf("workspace tree: file %s has %d bytes, the stored blob %d", hash, size, info.Size)
		}
		return false, nil
	}
	data, err := ws.Blob(ctx, hash)
	if err != nil {
		return false, fmt.Errorf("read workspace blob %s: %w", hash, err)
	}
	if sha256Hex(data) != hash {
		return false, fmt.Errorf("workspace blob %s: content does not match its hash", hash)
	}
	if int64(len(data)) != size {
		return false, fmt.Errorf("workspace tree: file %s has %d bytes, its blob %d", hash, size, len(data))
	}
	ctx, cancel := bus.ObjectContext(ctx)
	defer cancel()
	if _, err := s.blobs.PutBytes(ctx, name, data); err != nil {
		return false, fmt.Errorf("put %s: %w", name, err)
	}
	return true, nil
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
