package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
)

// Why a checkpoint was taken (its history entry's reason).
const (
	ReasonPeriodic = "periodic" // the supervisor's cadence
	ReasonSuspend  = "suspend"  // before the workload goes: idle suspend, driver exit, app-set change
	ReasonManual   = "manual"   // POST /v1/sessions/:id/checkpoints
	ReasonRestore  = "restore"  // the tree an earlier checkpoint was restored to
	ReasonFork     = "fork"     // taken of a fork's source, and a fork's first entry
)

// ValidReason reports whether r is one of the Reason constants.
func ValidReason(r string) bool {
	switch r {
	case ReasonPeriodic, ReasonSuspend, ReasonManual, ReasonRestore, ReasonFork:
		return true
	}
	return false
}

// DefaultHistory is how many checkpoints of a session are kept unless
// Options.History says otherwise; MaxHistory bounds that setting (the
// index lives in one key-value value beside the latest manifest).
const (
	DefaultHistory = 64
	MaxHistory     = 1024
)

// Checkpoint is one entry of a session's history.
type Checkpoint struct {
	ID      string    `json:"id"`
	TakenAt time.Time `json:"takenAt"`
	Reason  string    `json:"reason"`
	Files   int       `json:"files"`
	Bytes   int64     `json:"bytes"`
	// Slot names the key the entry's manifest is kept under (HistoryKey).
	Slot uint64 `json:"slot"`
}

// ErrNoCheckpoint is returned by Fork when the source has no checkpoint.
var ErrNoCheckpoint = errors.New("no checkpoint")

// ErrUnknownCheckpoint is returned by LoadCheckpoint for an id the
// session's history does not hold (never taken, or no longer kept).
var ErrUnknownCheckpoint = errors.New("checkpoint not in the session's history")

// HistoryKey is the runner_checkpoints key of one history slot of a
// session. Entry n of a history of size h is kept in slot n mod h, so the
// entry that falls out of the history is overwritten, not deleted (no
// delete marker per checkpoint).
func HistoryKey(sessionID string, slot uint64) string {
	return sessionID + "." + strconv.FormatUint(slot, 10)
}

// ValidID reports whether id has the shape of a checkpoint id (a decimal
// sequence number from 1). It says nothing about whether it exists.
func ValidID(id string) bool {
	if id == "" || len(id) > 19 || id[0] == '0' {
		return false
	}
	for i := range len(id) {
		if id[i] < '0' || id[i] > '9' {
			return false
		}
	}
	return true
}

// write stores r (TakenAt, Count, Root, Bytes) as the session's latest
// checkpoint with compare-and-set on rev (0: the session must have none),
// as the newest entry of its history (prev is the record replaced), then
// in its history slot. It returns the new checkpoint's id.
func (s *Store) write(ctx context.Context, sessionID string, r record, reason string, prev record, rev uint64) (string, error) {
	seq := prev.Seq + 1
	id := strconv.FormatUint(seq, 10)
	slot := seq % uint64(s.opts.History)
	r.ID, r.Reason = id, reason
	bytes := r.Bytes
	entry := Checkpoint{ID: id, TakenAt: r.TakenAt, Reason: reason, Files: r.Count, Bytes: bytes, Slot: slot}
	latest := r
	latest.Seq = seq
	latest.History = append([]Checkpoint{entry}, prev.History...)
	var dropped []Checkpoint
	if len(latest.History) > s.opts.History {
		dropped = latest.History[s.opts.History:]
		latest.History = latest.History[:s.opts.History]
	}
	value, err := json.Marshal(latest)
	if err != nil {
		return "", fmt.Errorf("encode checkpoint: %w", err)
	}
	if rev == 0 {
		_, err = s.kv.Create(ctx, sessionID, value)
	} else {
		_, err = s.kv.Update(ctx, sessionID, value, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return "", fmt.Errorf("write checkpoint %s: %w", sessionID, ErrConflict)
	}
	if err != nil {
		return "", fmt.Errorf("write checkpoint %s: %w", sessionID, err)
	}
	// Only the writer that won the compare-and-set writes the slot. Until
	// it has, the entry is restorable only while it is the latest.
	if err := putSlot(ctx, s.kv, sessionID, slot, r); err != nil {
		return "", err
	}
	for _, d := range dropped {
		if d.Slot != slot { // The history was shortened: a slot no entry uses now.
			if err := s.kv.Purge(ctx, HistoryKey(sessionID, d.Slot)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
				return "", fmt.Errorf("drop checkpoint %s of %s: %w", d.ID, sessionID, err)
			}
		}
	}
	return id, nil
}

func putSlot(ctx context.Context, kv jetstream.KeyValue, sessionID string, slot uint64, r record) error {
	r.Seq, r.History = 0, nil
	value, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	if _, err := kv.Put(ctx, HistoryKey(sessionID, slot), value); err != nil {
		return fmt.Errorf("write checkpoint %s of %s: %w", r.ID, sessionID, err)
	}
	return nil
}

// getRecord reads the record under key; false when there is none.
func getRecord(ctx context.Context, kv jetstream.KeyValue, key string) (record, bool, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, fmt.Errorf("get checkpoint %s: %w", key, err)
	}
	var r record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return record{}, false, fmt.Errorf("decode checkpoint %s: %w", key, err)
	}
	return r, true, nil
}

// History returns the session's kept checkpoints, newest first (none when
// it has no checkpoint, or only one stored before histories existed). It
// reads one key-value value, so the edge can answer it with the bucket
// alone.
func History(ctx context.Context, kv jetstream.KeyValue, sessionID string) ([]Checkpoint, error) {
	r, _, err := getRecord(ctx, kv, sessionID)
	if err != nil {
		return nil, err
	}
	return r.History, nil
}

// LoadCheckpoint returns the manifest of the session's kept checkpoint id
// and its history entry; ErrUnknownCheckpoint when the history does not
// hold it.
func (s *Store) LoadCheckpoint(ctx context.Context, sessionID, id string) (Manifest, Checkpoint, error) {
	latest, ok, err := getRecord(ctx, s.kv, sessionID)
	if err != nil {
		return Manifest{}, Checkpoint{}, err
	}
	if ok {
		for _, e := range latest.History {
			if e.ID != id {
				continue
			}
			key := HistoryKey(sessionID, e.Slot)
			if latest.ID == id {
				key = sessionID // The newest: its slot may not be written yet.
			}
			m, r, rev, err := s.load(ctx, key)
			if err != nil {
				return Manifest{}, Checkpoint{}, err
			}
			if rev == 0 || r.ID != id {
				break // Its slot was not written (a writer died) or is reused.
			}
			return m, e, nil
		}
	}
	return Manifest{}, Checkpoint{}, fmt.Errorf("checkpoint %s of %s: %w", id, sessionID, ErrUnknownCheckpoint)
}

// Fork gives session dst the latest checkpoint of src as its own first
// one (reason fork), copying metadata only: the root hash of its tree (or,
// for a checkpoint stored before trees, its flat file map or the name of
// its manifest object), never a node or a blob. dst must have no
// checkpoint.
// ErrNoCheckpoint when src has none.
func Fork(ctx context.Context, kv jetstream.KeyValue, src, dst string) (Checkpoint, error) {
	r, ok, err := getRecord(ctx, kv, src)
	if err != nil {
		return Checkpoint{}, err
	}
	if !ok {
		return Checkpoint{}, fmt.Errorf("fork %s: %w", src, ErrNoCheckpoint)
	}
	const seq = 1
	r.ID, r.Reason = strconv.Itoa(seq), ReasonFork
	entry := Checkpoint{ID: r.ID, TakenAt: r.TakenAt, Reason: r.Reason, Files: r.Count, Bytes: r.Bytes, Slot: seq}
	latest := r
	latest.Seq, latest.History = seq, []Checkpoint{entry}
	value, err := json.Marshal(latest)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("encode checkpoint: %w", err)
	}
	if _, err := kv.Create(ctx, dst, value); err != nil {
		return Checkpoint{}, fmt.Errorf("write checkpoint %s: %w", dst, err)
	}
	if err := putSlot(ctx, kv, dst, entry.Slot, r); err != nil {
		return Checkpoint{}, err
	}
	return entry, nil
}

// Purge drops the session's latest checkpoint and every history slot
// (absent is success). The blobs stay until CollectGarbage finds them
// unreferenced.
func Purge(ctx context.Context, kv jetstream.KeyValue, sessionID string) error {
	if err := bus.PurgeFamily(ctx, kv, sessionID); err != nil {
		return fmt.Errorf("delete checkpoints of %s: %w", sessionID, err)
	}
	return nil
}
