package checkpoint

import (
	"context"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
)

// Blob returns the stored content of hash (lowercase or uppercase hex
// SHA-256), checked against it: ErrMissingBlob when the store does not
// hold it. A restore that streams a manifest into a workspace (the
// driver's seeding) fetches each distinct hash once with it, instead of
// Files' path-ordered windows.
//
// A blob stored in one chunk (up to the object store's 128 KiB chunk
// size: most source files) is read with two direct gets, its metadata and
// its chunk, rather than through an ordered consumer created and deleted
// for it; anything else, or a direct get that fails, takes the object
// store's path.
func (s *Store) Blob(ctx context.Context, hash string) ([]byte, error) {
	h, ok := normalHash(hash)
	if !ok {
		return nil, fmt.Errorf("blob %q: not 64 hex digits of SHA-256", hash)
	}
	if data, ok := s.direct.blob(ctx, s, h); ok {
		return data, nil
	}
	return s.blob(ctx, h)
}

// directBlobs reads one-chunk blobs from the object store's stream.
type directBlobs struct {
	js     jetstream.JetStream
	mu     sync.Mutex
	stream jetstream.Stream // looked up at the first use
}

func (d *directBlobs) blob(ctx context.Context, s *Store, hash string) ([]byte, bool) {
	if d == nil {
		return nil, false
	}
	ctx, cancel := bus.ObjectContext(ctx)
	defer cancel()
	d.mu.Lock()
	if d.stream == nil {
		st, err := d.js.Stream(ctx, "OBJ_"+bus.ObjectBlobs)
		if err != nil {
			d.mu.Unlock()
			return nil, false
		}
		d.stream = st
	}
	st := d.stream
	d.mu.Unlock()
	info, err := s.blobs.GetInfo(ctx, bus.BlobKey(hash))
	if err != nil || info.Chunks != 1 {
		return nil, false
	}
	msg, err := st.GetLastMsgForSubject(ctx, "$O."+bus.ObjectBlobs+".C."+info.NUID)
	if err != nil || sha256Hex(msg.Data) != hash {
		return nil, false
	}
	return msg.Data, true
}
