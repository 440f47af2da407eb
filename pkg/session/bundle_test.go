package session_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
)

func bundleOf(contents string) contract.Bundle {
	return contract.Bundle{EntryRelativePath: "telo.yaml", Files: []contract.BundleFile{{RelativePath: "telo.yaml", Contents: contents}}}
}

func startingRecord(id string) session.Record {
	return session.Record{ID: id, Mode: contract.ModeRun, Status: contract.Status{Kind: contract.StatusStarting}, CreatedAt: time.Now().UTC()}
}

func wantBundle(t *testing.T, store *session.Store, id, contents string) {
	t.Helper()
	b, err := store.GetBundle(context.Background(), id)
	if err != nil || len(b.Files) != 1 || b.Files[0].Contents != contents {
		t.Fatalf("GetBundle(%s) = %+v, %v; want contents of %d bytes %.40q", id, b, err, len(contents), contents)
	}
}

// A small bundle is one key in bus.BucketBundles, a large one an object
// in bus.ObjectBundles; both read back through GetBundle.
func TestCreateWithBundleSmallInKVLargeInObjectStore(t *testing.T) {
	_, js, store := testkit.Session(t, bus.Limits{}, bus.RoleEdge)
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, bus.BucketBundles)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := js.ObjectStore(ctx, bus.ObjectBundles)
	if err != nil {
		t.Fatal(err)
	}
	small, large := contract.NewSessionID(), contract.NewSessionID()
	big := strings.Repeat("x", bus.BundleKVMax+1)
	for id, contents := range map[string]string{small: "kind: Small\n", large: big} {
		if err := store.CreateWithBundle(ctx, startingRecord(id), bundleOf(contents)); err != nil {
			t.Fatalf("CreateWithBundle(%s) = %v", id, err)
		}
		wantBundle(t, store, id, contents)
	}
	if _, err := kv.Get(ctx, small); err != nil {
		t.Fatalf("small bundle: key %s in %s: %v", small, bus.BucketBundles, err)
	}
	if _, err := obs.GetInfo(ctx, small); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatalf("small bundle: object %s in %s: %v, want not found", small, bus.ObjectBundles, err)
	}
	if _, err := kv.Get(ctx, large); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("large bundle: key %s in %s: %v, want not found", large, bus.BucketBundles, err)
	}
	if _, err := obs.GetInfo(ctx, large); err != nil {
		t.Fatalf("large bundle: object %s in %s: %v", large, bus.ObjectBundles, err)
	}
}

// An id collision with a session whose bundle is in the object store (one
// stored before the bucket existed): the losing creation's bundle is
// withdrawn, so the existing session still reads its own bundle; the
// error is the record's ErrKeyExists, which makes the edge draw again.
func TestCreateWithBundleCollisionWithdrawsItsBundle(t *testing.T) {
	_, js, store := testkit.Session(t, bus.Limits{}, bus.RoleEdge)
	ctx := context.Background()
	id := contract.NewSessionID()
	newRecord(t, store, id)
	obs, err := js.ObjectStore(ctx, bus.ObjectBundles)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := json.Marshal(bundleOf("kind: Old\n"))
	if _, err := obs.PutBytes(ctx, id, old); err != nil {
		t.Fatal(err)
	}
	err = store.CreateWithBundle(ctx, startingRecord(id), bundleOf("kind: Loser\n"))
	if !errors.Is(err, jetstream.ErrKeyExists) {
		t.Fatalf("CreateWithBundle over an existing record = %v, want ErrKeyExists", err)
	}
	wantBundle(t, store, id, "kind: Old\n")

	// And with the existing session's bundle in the bucket: untouched.
	other := contract.NewSessionID()
	if err := store.CreateWithBundle(ctx, startingRecord(other), bundleOf("kind: First\n")); err != nil {
		t.Fatal(err)
	}
	if err := store.CreateWithBundle(ctx, startingRecord(other), bundleOf("kind: Second\n")); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Fatalf("second CreateWithBundle(%s) = %v, want ErrKeyExists", other, err)
	}
	wantBundle(t, store, other, "kind: First\n")
}

// A bundle left under an id without a record (a creation that died
// between its bundle and its record) is stale: the creation that wins
// the record replaces it.
func TestCreateWithBundleReplacesAStaleBundle(t *testing.T) {
	_, js, store := testkit.Session(t, bus.Limits{}, bus.RoleEdge)
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, bus.BucketBundles)
	if err != nil {
		t.Fatal(err)
	}
	id := contract.NewSessionID()
	stale, _ := json.Marshal(bundleOf("kind: Stale\n"))
	if _, err := kv.Create(ctx, id, stale); err != nil {
		t.Fatal(err)
	}
	if err := store.CreateWithBundle(ctx, startingRecord(id), bundleOf("kind: Fresh\n")); err != nil {
		t.Fatalf("CreateWithBundle(%s) over a stale bundle = %v", id, err)
	}
	wantBundle(t, store, id, "kind: Fresh\n")
}

// Eviction removes a bundle from the bucket too.
func TestEvictRemovesKVBundle(t *testing.T) {
	_, js, store := testkit.Session(t, bus.Limits{}, bus.RoleEdge)
	ctx := context.Background()
	id, err := admitted(t, store, contract.ModeRun, session.Limits{MaxSessions: 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.PutBundle(ctx, id, bundleOf("kind: Gone\n")); err != nil {
		t.Fatal(err)
	}
	wantBundle(t, store, id, "kind: Gone\n")
	if err := store.Evict(ctx, id); err != nil {
		t.Fatalf("Evict(%s) = %v", id, err)
	}
	kv, err := js.KeyValue(ctx, bus.BucketBundles)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, id); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("bundle key %s after eviction: %v, want not found", id, err)
	}
	if _, err := store.GetBundle(ctx, id); err == nil {
		t.Fatalf("GetBundle(%s) after eviction succeeded", id)
	}
}
