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
	Mode uint32 `json:"mode,omitempty"` // Permission bits; 0 = unknown.
}

// Manifest is one checkpoint of a workspace: path → entry, and the time the
// tree was read.
type Manifest struct {
	TakenAt time.Time        `json:"takenAt"`
	Files   map[string]Entry `json:"files"`
	// ID names the checkpoint in its session's history ("" for one
	// written before histories existed).
	ID string `json:"id,omitempty"`
}

// manifestPrefix names out-of-line manifest objects in runner_blobs.
const manifestPrefix = "manifests/"

// record is the runner_checkpoints value: the manifest inline, or the name
// of the object holding its encoded file map.
//
// The session's key (<sessionId>) holds its latest checkpoint plus the
// history index (newest first) and the last sequence drawn; each kept
// checkpoint is also stored under a history slot key (HistoryKey) with the
// same shape and no index.
type record struct {
	TakenAt  time.Time        `json:"takenAt"`
	Count    int              `json:"count"`
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

// load returns the manifest stored under key, its record and the value's
// revision (0 when there is none).
func (s *Store) load(ctx context.Context, key string) (Manifest, record, uint64, error) {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Manifest{Files: map[string]Entry{}}, record{}, 0, nil
	}
	if err != nil {
		return Manifest{}, record{}, 0, fmt.Errorf("get checkpoint %s: %w", key, err)
	}
	var r record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return Manifest{}, record{}, 0, fmt.Errorf("decode checkpoint %s: %w", key, err)
	}
	files, err := s.files(ctx, r)
	if err != nil {
		return Manifest{}, record{}, 0, fmt.Errorf("load checkpoint %s: %w", key, err)
	}
	return Manifest{TakenAt: r.TakenAt, Files: files, ID: r.ID}, r, e.Revision(), nil
}

// files returns a record's file map, reading it from its object when it
// is stored out of line.
func (s *Store) files(ctx context.Context, r record) (map[string]Entry, error) {
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
func (s *Store) ensureObject(ctx context.Context, name string, data []byte) error {
	found, err := s.adopt(ctx, name)
	if err != nil || found != nil {
		return err
	}
	ctx, cancel := bus.ObjectContext(ctx)
	defer cancel()
	if _, err := s.blobs.PutBytes(ctx, name, data); err != nil {
		return fmt.Errorf("put %s: %w", name, err)
	}
	return nil
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
