package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/merkle"
	"github.com/telorunner/telorunner/pkg/parallel"
)

// Take checkpoints ws as the session's new checkpoint and returns it.
// Only what the store lacks is read from ws and stored; unchanged
// directories are not even listed. On any error (including ErrConflict
// when another Take of the session finished first) the previous
// checkpoint stays as it was; objects already uploaded are left for a
// later Take or the collector.
func (s *Store) Take(ctx context.Context, sessionID string, ws Workspace) (Manifest, Stats, error) {
	return s.TakeAs(ctx, sessionID, ReasonPeriodic, ws)
}

// TakeAs is Take recording reason (ReasonPeriodic, ReasonSuspend, ...) in
// the session's history. The new checkpoint becomes the newest entry of
// the history, which keeps Options.History entries. A periodic Take of a
// tree equal to the latest checkpoint's writes nothing and returns the
// latest (its ID, its TakenAt).
//
// The Manifest returned names the checkpoint (ID, TakenAt, Root) without
// its file map, which Take never reads whole: Load or LoadCheckpoint
// return that.
func (s *Store) TakeAs(ctx context.Context, sessionID, reason string, ws Workspace) (Manifest, Stats, error) {
	var st Stats
	if !ValidReason(reason) {
		return Manifest{}, st, fmt.Errorf("checkpoint: unknown reason %q", reason)
	}
	if !contract.ValidSessionID(sessionID) {
		return Manifest{}, st, fmt.Errorf("checkpoint: invalid session id %q", sessionID)
	}
	start := s.opts.Now()
	prevRec, rev, err := s.latest(ctx, sessionID)
	if err != nil {
		return Manifest{}, st, err
	}
	d := &diff{s: s, ws: ws, known: map[string]bool{}, blobs: map[string]int64{}, nodes: map[string][]byte{}}
	prevRoot, err := d.previous(ctx, prevRec, rev)
	if err != nil {
		return Manifest{}, st, fmt.Errorf("load checkpoint %s: %w", sessionID, err)
	}
	rootData, err := ws.Root(ctx)
	if err != nil {
		return Manifest{}, st, fmt.Errorf("read workspace tree: %w", err)
	}
	root := merkle.Hash(rootData)
	rootNode, err := merkle.Decode(rootData)
	if err != nil {
		return Manifest{}, st, fmt.Errorf("workspace tree: %w", err)
	}
	d.st.NodesRead = 1
	if err := d.walk(ctx, root, rootNode, rootData, prevRoot); err != nil {
		return Manifest{}, d.st, err
	}
	st = d.st
	st.Files, st.BytesTotal = rootNode.Totals()

	// The same tree: the same root, or for a flat previous checkpoint
	// (modes unknown) the same paths and contents.
	same := root == prevRoot || (!d.prevStored && st.Changed == 0 && st.Removed == 0)
	if reason == ReasonPeriodic && rev != 0 && prevRec.ID != "" && same {
		// Nothing changed since the latest checkpoint: a tick adds no
		// history entry (the history holds changes, not ticks).
		return Manifest{TakenAt: prevRec.TakenAt, ID: prevRec.ID, Root: prevRec.Root}, st, nil
	}
	if err := d.upload(ctx); err != nil {
		return Manifest{}, d.st, err
	}
	st.Uploaded, st.BytesUploaded, st.NodesStored = d.st.Uploaded, d.st.BytesUploaded, d.st.NodesStored
	if took := s.opts.Now().Sub(start); took >= s.opts.Grace {
		return Manifest{}, st, fmt.Errorf("checkpoint %s: took %v, longer than the %v grace period of its uploads", sessionID, took, s.opts.Grace)
	}
	r := record{TakenAt: start.UTC(), Count: st.Files, Root: root, Bytes: st.BytesTotal}
	id, err := s.write(ctx, sessionID, r, reason, prevRec, rev)
	if err != nil {
		return Manifest{}, st, err
	}
	return Manifest{TakenAt: r.TakenAt, ID: id, Root: root}, st, nil
}

// diff compares the workspace's tree with the previous checkpoint's, level
// by level, descending only into directories whose hash differs. It
// collects the nodes and the blobs the new checkpoint needs and the
// previous one did not have.
type diff struct {
	s  *Store
	ws Workspace
	// prevNode reads a node of the previous checkpoint; prevStored says
	// whether those nodes are in the store (false for a checkpoint stored
	// as a flat file map before trees existed: then every node is checked).
	prevNode   merkle.Getter
	prevStored bool
	known      map[string]bool   // Blobs the store holds (the previous checkpoint's).
	blobs      map[string]int64  // Blobs of changed files → size.
	nodes      map[string][]byte // Nodes of the new tree that may be new to the store.
	st         Stats
}

// previous prepares the previous checkpoint (none when rev is 0) and
// returns its root hash.
func (d *diff) previous(ctx context.Context, r record, rev uint64) (string, error) {
	d.prevNode = d.s.node
	if rev == 0 {
		return "", nil
	}
	if r.Root != "" {
		d.prevStored = true
		return r.Root, nil
	}
	files, err := d.s.files(ctx, r) // A flat record: build its tree in memory.
	if err != nil {
		return "", err
	}
	flat := make([]merkle.File, 0, len(files))
	for p, e := range files {
		flat = append(flat, merkle.File{Path: p, Hash: e.Hash, Size: e.Size, Mode: e.Mode})
		d.known[e.Hash] = true
	}
	b, err := merkle.Build(flat)
	if err != nil {
		return "", err
	}
	d.prevNode = func(_ context.Context, h string) (merkle.Node, error) { return merkle.Decode(b.Nodes[h]) }
	return b.Root, nil
}

// pair is one directory of the walk: its hash in the new tree and in the
// previous one ("" when it is new).
type pair struct {
	path, next, prev string
}

func (d *diff) walk(ctx context.Context, root string, rootNode merkle.Node, rootData []byte, prevRoot string) error {
	level := []pair{{"", root, prevRoot}}
	d.nodes[root] = rootData
	for len(level) > 0 {
		level = slices.DeleteFunc(level, func(p pair) bool { return d.prevStored && p.next == p.prev })
		next := make([]merkle.Node, len(level))
		prev := make([]merkle.Node, len(level))
		read := make([][]byte, len(level))
		err := parallel.Do(ctx, len(level), d.s.opts.Concurrency, func(ctx context.Context, i int) error {
			p := level[i]
			if p.prev != "" {
				n, err := d.prevNode(ctx, p.prev)
				if err != nil && !errors.Is(err, ErrMissingBlob) {
					return fmt.Errorf("previous checkpoint: %w", err)
				}
				prev[i] = n // A node lost from the store: compare with nothing.
			}
			if p.next == root {
				next[i] = rootNode
				return nil
			}
			data, err := d.ws.Node(ctx, p.next)
			if err != nil {
				return fmt.Errorf("read workspace tree node %s: %w", p.next, err)
			}
			n, err := merkle.DecodeAs(p.next, data)
			if err != nil {
				return fmt.Errorf("workspace tree: %w", err)
			}
			next[i], read[i] = n, data
			return nil
		})
		if err != nil {
			return err
		}
		var deeper []pair
		for i, p := range level {
			if read[i] != nil {
				d.nodes[p.next] = read[i]
				d.st.NodesRead++
			}
			deeper = d.compare(p.path, next[i], prev[i], deeper)
		}
		level = deeper
	}
	return nil
}

// compare diffs the entries of one directory, counting changes, and
// appends its subdirectories that need a look to deeper.
func (d *diff) compare(dir string, next, prev merkle.Node, deeper []pair) []pair {
	for _, e := range prev.Entries {
		if e.Kind == merkle.KindFile && d.prevStored {
			d.known[e.Hash] = true // Referenced by the stored checkpoint.
		}
	}
	join := func(name string) string {
		if dir == "" {
			return name
		}
		return dir + "/" + name
	}
	for _, e := range next.Entries {
		old, had := prev.Lookup(e.Name)
		switch {
		case e.Kind == merkle.KindDir:
			prevHash := ""
			if had && old.Kind == merkle.KindDir {
				prevHash = old.Hash
			} else if had {
				d.st.Removed++ // A file became a directory.
			}
			deeper = append(deeper, pair{join(e.Name), e.Hash, prevHash})
		default:
			if had && old.Kind == merkle.KindDir {
				d.st.Removed += old.Files // A directory became a file.
			}
			// A flat previous checkpoint recorded no modes (0).
			modeChanged := old.Mode != e.Mode && (d.prevStored || old.Mode != 0)
			if !had || old.Kind != merkle.KindFile || old.Hash != e.Hash || modeChanged {
				d.st.Changed++
				d.blobs[e.Hash] = e.Size
			}
		}
	}
	for _, old := range prev.Entries {
		if _, ok := next.Lookup(old.Name); ok {
			continue
		}
		if old.Kind == merkle.KindDir {
			d.st.Removed += old.Files
		} else {
			d.st.Removed++
		}
	}
	return deeper
}

// upload stores the blobs the store lacks, then the tree nodes.
func (d *diff) upload(ctx context.Context) error {
	var missing []string
	for h := range d.blobs {
		if !d.known[h] {
			missing = append(missing, h)
		}
	}
	slices.Sort(missing)
	uploaded := make([]bool, len(missing))
	err := parallel.Do(ctx, len(missing), d.s.opts.Concurrency, func(ctx context.Context, i int) error {
		var err error
		uploaded[i], err = d.s.ensureBlob(ctx, d.ws, missing[i], d.blobs[missing[i]])
		return err
	})
	if err != nil {
		return err
	}
	for i, h := range missing {
		if uploaded[i] {
			d.st.Uploaded++
			d.st.BytesUploaded += d.blobs[h]
		}
	}
	hashes := slices.Sorted(maps.Keys(d.nodes))
	stored := make([]bool, len(hashes))
	err = parallel.Do(ctx, len(hashes), d.s.opts.Concurrency, func(ctx context.Context, i int) error {
		var err error
		stored[i], err = d.s.ensureObject(ctx, bus.TreeKey(hashes[i]), d.nodes[hashes[i]])
		return err
	})
	if err != nil {
		return err
	}
	for i, h := range hashes {
		if stored[i] {
			d.st.NodesStored++
		}
		if n, err := merkle.Decode(d.nodes[h]); err == nil {
			d.s.nodes.add(h, n, len(d.nodes[h]))
		}
	}
	return nil
}
