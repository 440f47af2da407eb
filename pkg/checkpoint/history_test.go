package checkpoint

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
)

// A history of three over five checkpoints: the newest three are listed
// newest first and restorable, the older two are gone, and the collector
// removes exactly the blobs only they referenced.
func TestHistoryKeepsTheNewest(t *testing.T) {
	e := newEnv(t)
	grace := time.Minute
	var now time.Time
	s := e.store(t, Options{Grace: grace, Now: func() time.Time { return now }, History: 3})
	ctx := t.Context()
	now = time.Now()
	id := newID()
	ws := newMemWorkspace(map[string][]byte{"shared": []byte("shared")})
	reasons := []string{ReasonPeriodic, ReasonManual, ReasonSuspend, ReasonRestore, ReasonPeriodic}
	for i, r := range reasons {
		ws.set("v", fmt.Appendf(nil, "version %d", i+1))
		m, _, err := s.TakeAs(ctx, id, r, ws)
		if err != nil {
			t.Fatalf("TakeAs(%d) = %v", i+1, err)
		}
		if m.ID != fmt.Sprint(i+1) {
			t.Fatalf("TakeAs(%d) id = %q, want %d", i+1, m.ID, i+1)
		}
	}
	h, err := History(ctx, e.kv(t), id)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range h {
		ids = append(ids, c.ID+":"+c.Reason)
		if c.Files != 2 || c.Bytes != int64(len("shared")+len("version 1")) {
			t.Fatalf("entry %+v: want 2 files of %d bytes", c, len("shared")+len("version 1"))
		}
	}
	if want := []string{"5:periodic", "4:restore", "3:suspend"}; !slices.Equal(ids, want) {
		t.Fatalf("History() = %v, want %v", ids, want)
	}
	for i := 3; i <= 5; i++ {
		m, c, err := s.LoadCheckpoint(ctx, id, fmt.Sprint(i))
		if err != nil || c.ID != fmt.Sprint(i) {
			t.Fatalf("LoadCheckpoint(%d) = %+v, %v", i, c, err)
		}
		if got := restored(t, s, m); string(got["v"]) != fmt.Sprintf("version %d", i) || string(got["shared"]) != "shared" {
			t.Fatalf("LoadCheckpoint(%d) files = %q", i, got)
		}
	}
	for _, old := range []string{"1", "2", "6", "x"} {
		if _, _, err := s.LoadCheckpoint(ctx, id, old); !errors.Is(err, ErrUnknownCheckpoint) {
			t.Fatalf("LoadCheckpoint(%s) = %v, want ErrUnknownCheckpoint", old, err)
		}
	}
	now = after(t, s).Add(grace)
	if n, err := s.CollectGarbage(ctx); err != nil || n != 4 {
		t.Fatalf("CollectGarbage() = %d, %v; want 4 (versions 1 and 2, and their root nodes)", n, err)
	}
	names := objectNames(t, s)
	for i := 1; i <= 5; i++ {
		has := slices.Contains(names, bus.BlobKey(hashOf(fmt.Appendf(nil, "version %d", i))))
		if has != (i >= 3) {
			t.Fatalf("blob of version %d present = %v after collection; objects %v", i, has, names)
		}
	}
}

// A shorter history setting drops the slots no entry uses any more.
func TestHistoryShortened(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	id := newID()
	ws := newMemWorkspace(map[string][]byte{"a": []byte("a")})
	long := e.store(t, Options{History: 4})
	for i := range 4 {
		ws.set("v", fmt.Appendf(nil, "%d", i))
		if _, _, err := long.Take(ctx, id, ws); err != nil {
			t.Fatal(err)
		}
	}
	short := e.store(t, Options{History: 2})
	ws.set("v", []byte("last"))
	if _, _, err := short.Take(ctx, id, ws); err != nil {
		t.Fatal(err)
	}
	h, err := History(ctx, e.kv(t), id)
	if err != nil || len(h) != 2 || h[0].ID != "5" || h[1].ID != "4" {
		t.Fatalf("History() = %+v, %v; want 5, 4", h, err)
	}
	keys := e.keys(t)
	var slots []string
	for _, k := range keys {
		if strings.HasPrefix(k, id+".") {
			slots = append(slots, k)
		}
	}
	// Entry 5 in slot 1 (5 mod 2), entry 4 in slot 0 (4 mod 4); 1-3's
	// slots 1, 2, 3: 1 reused, 2 and 3 dropped.
	slices.Sort(slots)
	if want := []string{id + ".0", id + ".1"}; !slices.Equal(slots, want) {
		t.Fatalf("slot keys = %v, want %v", slots, want)
	}
}

// Fork copies metadata only: no object is written, and the fork's
// checkpoint is the source's tree under a history of its own.
func TestForkCopiesMetadataOnly(t *testing.T) {
	for _, format := range []string{"tree", "flat"} { // A checkpoint stored before trees forks too.
		t.Run(format, func(t *testing.T) {
			e := newEnv(t)
			s := e.store(t, Options{})
			ctx := t.Context()
			src, dst := newID(), newID()
			files := sourceFiles(40)
			if format == "tree" {
				if _, _, err := s.Take(ctx, src, newMemWorkspace(files)); err != nil {
					t.Fatal(err)
				}
			} else {
				putFlat(t, s, src, putBlobs(t, s, files), true)
			}
			before := objectNames(t, s)
			c, err := Fork(ctx, e.kv(t), src, dst)
			if err != nil {
				t.Fatalf("Fork() = %v", err)
			}
			if got := objectNames(t, s); !slices.Equal(got, before) {
				t.Fatalf("objects after Fork() = %d, before %d: want none added", len(got), len(before))
			}
			if c.ID != "1" || c.Reason != ReasonFork || c.Files != 40 || c.Bytes != sumSizes(files) {
				t.Fatalf("Fork() = %+v", c)
			}
			m, ok, err := s.Load(ctx, dst)
			if err != nil || !ok {
				t.Fatalf("Load(fork) = %v, %v", ok, err)
			}
			got := restored(t, s, m)
			if len(got) != len(files) {
				t.Fatalf("fork has %d files, want %d", len(got), len(files))
			}
			for p, b := range files {
				if string(got[p]) != string(b) {
					t.Fatalf("fork %s = %q, want %q", p, got[p], b)
				}
			}
			if _, _, err := s.LoadCheckpoint(ctx, dst, "1"); err != nil {
				t.Fatalf("LoadCheckpoint(fork, 1) = %v", err)
			}
			if _, err := Fork(ctx, e.kv(t), src, dst); err == nil {
				t.Fatal("Fork() onto a session with a checkpoint succeeded")
			}
			if _, err := Fork(ctx, e.kv(t), newID(), newID()); !errors.Is(err, ErrNoCheckpoint) {
				t.Fatalf("Fork() of a session without checkpoint = %v, want ErrNoCheckpoint", err)
			}
			// The fork goes on from its own history.
			ws := newMemWorkspace(files)
			ws.set("new", []byte("new"))
			if m, _, err := s.TakeAs(ctx, dst, ReasonManual, ws); err != nil || m.ID != "2" {
				t.Fatalf("TakeAs(fork) = %q, %v; want id 2", m.ID, err)
			}
		})
	}
}

func TestDeleteDropsHistory(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	ctx := t.Context()
	id, other := newID(), newID()
	ws := newMemWorkspace(map[string][]byte{"a": []byte("a")})
	for _, sid := range []string{id, id, id, other} {
		ws.set("v", []byte(sid+time.Now().String()))
		if _, _, err := s.Take(ctx, sid, ws); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delete(ctx, id); err != nil {
		t.Fatalf("Delete() = %v", err)
	}
	for _, k := range e.keys(t) {
		if strings.HasPrefix(k, id) {
			t.Fatalf("key %s left after Delete()", k)
		}
	}
	if h, err := History(ctx, e.kv(t), other); err != nil || len(h) != 1 {
		t.Fatalf("other session's History() = %+v, %v", h, err)
	}
}

func TestTakeAsRefusesUnknownReason(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	if _, _, err := s.TakeAs(t.Context(), newID(), "whim", newMemWorkspace(nil)); err == nil {
		t.Fatal("TakeAs(whim) succeeded")
	}
}

// A periodic checkpoint of an unchanged tree adds no entry; any other
// reason does.
func TestPeriodicUnchangedAddsNoEntry(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	ctx := t.Context()
	id := newID()
	ws := newMemWorkspace(map[string][]byte{"a": []byte("a")})
	for _, r := range []string{ReasonPeriodic, ReasonPeriodic, ReasonManual, ReasonPeriodic} {
		if _, _, err := s.TakeAs(ctx, id, r, ws); err != nil {
			t.Fatal(err)
		}
	}
	h, err := History(ctx, e.kv(t), id)
	if err != nil || len(h) != 2 || h[0].Reason != ReasonManual || h[1].Reason != ReasonPeriodic {
		t.Fatalf("History() = %+v, %v; want manual, periodic", h, err)
	}
	ws.remove("a")
	if m, _, err := s.Take(ctx, id, ws); err != nil || m.ID != "3" {
		t.Fatalf("Take() after a removal = %q, %v; want a new entry 3", m.ID, err)
	}
}
