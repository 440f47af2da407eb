package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
)

// CollectGarbage deletes every blob (sha256/*) and manifest object
// (manifests/*) of runner_blobs that no stored manifest references and
// that is older than Options.Grace, and returns how many it deleted.
// Objects under other names are left alone. It reads every manifest, so
// run it from one place on a slow cadence; an unreadable checkpoint value
// stops it before anything is deleted.
func (s *Store) CollectGarbage(ctx context.Context) (int, error) {
	// Objects first: anything written after this listing is not a candidate.
	objs, err := s.blobs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", bus.ObjectBlobs, err)
	}
	live, err := s.referenced(ctx)
	if err != nil {
		return 0, err
	}
	cutoff := s.opts.Now().Add(-s.opts.Grace)
	removed := 0
	for _, o := range objs {
		if !strings.HasPrefix(o.Name, bus.BlobKey("")) && !strings.HasPrefix(o.Name, manifestPrefix) {
			continue
		}
		if live[o.Name] || !o.ModTime.Before(cutoff) {
			continue
		}
		// A Take may have adopted it since the listing: look again.
		info, err := s.blobs.GetInfo(ctx, o.Name)
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			continue
		}
		if err != nil {
			return removed, fmt.Errorf("stat %s: %w", o.Name, err)
		}
		if !info.ModTime.Before(cutoff) {
			continue
		}
		if err := s.blobs.Delete(ctx, o.Name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return removed, fmt.Errorf("delete %s: %w", o.Name, err)
		}
		removed++
	}
	return removed, nil
}

// referenced returns the object names every stored manifest references:
// its blobs and, for one stored out of line, its manifest object. A
// manifest object that is gone is skipped (that checkpoint is already
// lost, and what it referenced cannot be known).
func (s *Store) referenced(ctx context.Context) (map[string]bool, error) {
	w, err := s.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", bus.BucketCheckpoints, err)
	}
	defer func() { _ = w.Stop() }() // Read-only watcher.
	live := map[string]bool{}
	for {
		var e jetstream.KeyValueEntry
		select {
		case e = <-w.Updates():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if e == nil {
			return live, nil // Every current value seen.
		}
		var r record
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			return nil, fmt.Errorf("decode checkpoint %s: %w", e.Key(), err)
		}
		if r.Manifest != "" {
			if live[r.Manifest] {
				continue // Same tree as another session: same blobs.
			}
			live[r.Manifest] = true
		}
		files, err := s.files(ctx, r)
		if errors.Is(err, ErrMissingBlob) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read checkpoint %s: %w", e.Key(), err)
		}
		for _, f := range files {
			live[bus.BlobKey(f.Hash)] = true
		}
	}
}
