package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/merkle"
	"github.com/telorunner/telorunner/pkg/parallel"
)

// CollectGarbage deletes every blob (sha256/*), tree node (trees/*) and
// manifest object (manifests/*, from before trees) of runner_blobs that
// no stored checkpoint references and that is older than Options.Grace,
// and returns how many it deleted. Objects under other names are left
// alone. It reads every checkpoint's tree (each distinct node once), so
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
		if !strings.HasPrefix(o.Name, bus.BlobKey("")) && !strings.HasPrefix(o.Name, bus.TreeKey("")) &&
			!strings.HasPrefix(o.Name, manifestPrefix) {
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

// referenced returns the object names every stored checkpoint
// references: the nodes of its tree and their blobs, or for a flat record
// its blobs and, stored out of line, its manifest object. A node or
// manifest object that is gone is skipped (that part of the checkpoint is
// already lost, and what it referenced cannot be known).
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
		if r.Root != "" {
			if err := s.mark(ctx, r.Root, live); err != nil {
				return nil, fmt.Errorf("read checkpoint %s: %w", e.Key(), err)
			}
			continue
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

// mark adds to live every node and blob of the tree rooted at root,
// reading the nodes of one level at a time. A node already live was
// marked with its whole subtree (by another checkpoint sharing it) and is
// not read again.
func (s *Store) mark(ctx context.Context, root string, live map[string]bool) error {
	level := []string{root}
	for len(level) > 0 {
		var todo []string
		for _, h := range level {
			if name := bus.TreeKey(h); !live[name] {
				live[name] = true
				todo = append(todo, h)
			}
		}
		nodes := make([]merkle.Node, len(todo))
		err := parallel.Do(ctx, len(todo), s.opts.Concurrency, func(ctx context.Context, i int) error {
			n, err := s.node(ctx, todo[i])
			if errors.Is(err, ErrMissingBlob) {
				return nil // Lost: what it referenced cannot be known.
			}
			nodes[i] = n
			return err
		})
		if err != nil {
			return err
		}
		level = level[:0]
		for _, n := range nodes {
			for _, e := range n.Entries {
				if e.Kind == merkle.KindDir {
					level = append(level, e.Hash)
				} else {
					live[bus.BlobKey(e.Hash)] = true
				}
			}
		}
	}
	return nil
}
