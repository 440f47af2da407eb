package session_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
)

func openStore(t *testing.T) *session.Store {
	t.Helper()
	_, _, store := testkit.Session(t, bus.Limits{}, bus.RoleEdge)
	return store
}

func TestSlotReadsBothLedgerFormats(t *testing.T) {
	var sl session.Slots
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	if err := json.Unmarshal([]byte(`{"ids":{"a":"run","b":{"mode":"watch","at":"2026-11-29T12:00:00Z"}}}`), &sl); err != nil {
		t.Fatalf("Unmarshal() = %v", err)
	}
	if sl.IDs["a"] != (session.Slot{Mode: "run"}) || sl.IDs["b"] != (session.Slot{Mode: "watch", At: at}) {
		t.Errorf("slots = %+v", sl.IDs)
	}
	if err := json.Unmarshal([]byte(`{"ids":{"a":42}}`), &sl); err == nil {
		t.Error("Unmarshal(number slot) = nil, want an error")
	}
}

// A ledger written by the first format (id → mode) keeps admitting: its
// slots count, and one whose record is gone is reclaimed when full.
func TestAdmitOverAnOldLedger(t *testing.T) {
	store := openStore(t)
	ctx := context.Background()
	live, gone := contract.NewSessionID(), contract.NewSessionID()
	if err := store.Create(ctx, session.Record{ID: live, Mode: contract.ModeWatch, Status: contract.Status{Kind: contract.StatusRunning}}); err != nil {
		t.Fatal(err)
	}
	old := `{"ids":{"` + live + `":"watch","` + gone + `":"run"}}`
	if _, err := store.Admission.Put(ctx, bus.KeyAdmissionSlots, []byte(old)); err != nil {
		t.Fatal(err)
	}
	if n, err := store.CountLiveWatch(ctx); err != nil || n != 1 {
		t.Fatalf("CountLiveWatch() = %d, %v; want 1", n, err)
	}
	// Full at 2: the slot without a record (and without an admission time)
	// is the one reclaimed.
	id := contract.NewSessionID()
	if err := store.Admit(ctx, id, contract.ModeRun, session.Limits{MaxSessions: 2}); err != nil {
		t.Fatalf("Admit() = %v", err)
	}
	sl, _, err := bus.GetJSON[session.Slots](ctx, store.Admission, bus.KeyAdmissionSlots)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sl.IDs[gone]; ok || sl.IDs[live].Mode != contract.ModeWatch || sl.IDs[id].Mode != contract.ModeRun || sl.IDs[id].At.IsZero() {
		t.Errorf("ledger after Admit = %+v", sl.IDs)
	}
	// Full with nothing reclaimable: the contract's refusal.
	err = store.Admit(ctx, contract.NewSessionID(), contract.ModeRun, session.Limits{MaxSessions: 2})
	var ce *contract.Error
	if !errors.As(err, &ce) || ce.Code != "too_many_sessions" {
		t.Errorf("Admit() when full = %v, want too_many_sessions", err)
	}
}
