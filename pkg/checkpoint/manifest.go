package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
)

// Entry is one file of a manifest.
type Entry struct {
	Hash string `json:"hash"` // Lowercase hex SHA-256 of the bytes.
	Size int64  `json:"size"`
	// Mode is the permission bits (0o755, 0o644, ...); 0 = unknown (a
	// checkpoint stored before modes were recorded).
	Mode uint32 `json:"mode,omitempty"`
}

// Manifest is one checkpoint of a workspace: path → entry, and the time the
// tree was read.
type Manifest struct {
	TakenAt time.Time        `json:"takenAt"`
	Files   map[string]Entry `json:"files"`
	// ID names the checkpoint in its session's history ("" for one
	// written before histories existed).
	ID string `json:"id,omitempty"`
	// Root is the hash of the checkpoint's root tree node ("" for one
	// stored as a flat file map before trees existed).
	Root string `json:"root,omitempty"`
}

// manifestPrefix names out-of-line manifest objects in runner_blobs,
// written before checkpoints were trees (still read, and collected).
const manifestPrefix = "manifests/"

// record is the runner_checkpoints value: the hash of the checkpoint's
// root tree node (trees/<hash> in runner_blobs). Records written before
// trees existed hold the file map instead, inline or as the name of the
// object holding its encoding; they are still read.
//
// The session's key (<sessionId>) holds its latest checkpoint plus the
// history index (newest first) and the last sequence drawn; each kept
// checkpoint is also stored under a history slot key (HistoryKey) with the
// same shape and no index.
type record struct {
	TakenAt  time.Time        `json:"takenAt"`
	Count    int              `json:"count"`
	Root     string           `json:"root,omitempty"`
	Files    map[string]Entry `json:"files,omitempty"`
	Manifest string           `json:"manifest,omitempty"`
	ID       string           `json:"id,omitempty"`
	Reason   string           `json:"reason,omitempty"`
	Bytes    int64            `json:"bytes,omitempty"`
	Seq      uint64           `json:"seq,omitempty"`
	History  []Checkpoint     `json:"history,omitempty"`
}

// ErrConflict is returned by Take when the session's checkpoint changed
// while it ran (another Take won); the manifest stored is the other one.
var ErrConflict = errors.New("checkpoint changed concurrently")

// ErrMissingBlob is returned when a manifest names content the store
// does not hold.
var ErrMissingBlob = errors.New("blob missing from the store")

// Load returns the session's last manifest; false when it has none.
func (s *Store) Load(ctx context.Context, sessionID string) (Manifest, bool, error) {
	m, _, rev, err := s.load(ctx, sessionID)
	return m, rev != 0, err
}

// load returns the manifest stored under key (its file map read from its
// tree), its record and the value's revision (0 when there is none).
func (s *Store) load(ctx context.Context, key string) (Manifest, record, uint64, error) {
	r, rev, err := s.latest(ctx, key)
	if err != nil || rev == 0 {
		return Manifest{Files: map[string]Entry{}}, r, rev, err
	}
	files, err := s.files(ctx, r)
	if err != nil {
		return Manifest{}, record{}, 0, fmt.Errorf("load checkpoint %s: %w", key, err)
	}
	return Manifest{TakenAt: r.TakenAt, Files: files, ID: r.ID, Root: r.Root}, r, rev, nil
}

// latest returns the record stored under key and the value's revision (0
// when there is none).
func (s *Store) latest(ctx context.Context, key string) (record, uint64, error) {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return record{}, 0, nil
	}
	if err != nil {
		return record{}, 0, fmt.Errorf("get checkpoint %s: %w", key, err)
	}
	var r record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return record{}, 0, fmt.Errorf("decode checkpoint %s: %w", key, err)
	}
	return r, e.Revision(), nil
}

// files returns a record's file map: walked from its tree, or for a flat
// record inline or read from its object.
func (s *Store) files(ctx context.Context, r record) (map[string]Entry, error) {
	if r.Root != "" {
		return s.treeFiles(ctx, r.Root)
	}
	if r.Manifest == "" {
		if r.Files == nil {
			return map[string]Entry{}, nil
		}
		return r.Files, nil
	}
	ctx, cancel := bus.ObjectContext(ctx)
	defer cancel()
	data, err := s.blobs.GetBytes(ctx, r.Manifest)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("manifest %s: %w", r.Manifest, ErrMissingBlob)
	}
	if err != nil {
		return nil, fmt.Errorf("get manifest %s: %w", r.Manifest, err)
	}
	if manifestPrefix+sha256Hex(data) != r.Manifest {
		return nil, fmt.Errorf("manifest %s: content does not match its name", r.Manifest)
	}
	files := map[string]Entry{}
	if err := json.Unmarshal(data, &files); err != nil {
		return nil, fmt.Errorf("decode manifest %s: %w", r.Manifest, err)
	}
	return files, nil
}

// ensureObject stores data under name unless an object of that name (a
// content address) is already there, in which case it refreshes its
// modification time when it is old enough to be near collection.
// It reports whether it stored data.
func (s *Store) ensureObject(ctx context.Context, name string, data []byte) (bool, error) {
	found, err := s.adopt(ctx, name)
	if err != nil || found != nil {
		return false, err
	}
	ctx, cancel := bus.ObjectContext(ctx)
	defer cancel()
	if _, err := s.blobs.PutBytes(ctx, name, data); err != nil {
		return false, fmt.Errorf("put %s: %w", name, err)
	}
	return true, nil
}

// adopt returns the info of the object name (nil when absent), first
// refreshing its modification time when it is older than half the grace
// period, so the collector leaves it to the Take about to reference it.
func (s *Store) adopt(ctx context.Context, name string) (*jetstream.ObjectInfo, error) {
	info, err := s.blobs.GetInfo(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", name, err)
	}
	if s.opts.Now().Sub(info.ModTime) > s.opts.Grace/2 {
		err := s.blobs.UpdateMeta(ctx, name, info.ObjectMeta)
		if errors.Is(err, jetstream.ErrUpdateMetaDeleted) {
			return nil, nil // Collected meanwhile: store it again.
		}
		if err != nil {
			return nil, fmt.Errorf("refresh %s: %w", name, err)
		}
	}
	return info, nil
}

// Delete drops the session's manifest and its history (absent is
// success). The blobs stay until CollectGarbage finds them unreferenced.
func (s *Store) Delete(ctx context.Context, sessionID string) error {
	return Purge(ctx, s.kv, sessionID)
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// normalHash returns h in lowercase when it is 64 hex digits.
func normalHash(h string) (string, bool) {
	if len(h) != 64 {
		return "", false
	}
	h = strings.ToLower(h)
	for i := range len(h) {
		if c := h[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", false
		}
	}
	return h, true
}
