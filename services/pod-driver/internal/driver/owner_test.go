package driver

import (
	"context"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// An owner-key update whose answer was lost (here: the key moved to a
// newer revision that still names this driver) does not read as another
// driver's adoption: the driver keeps renewing its key and its workload
// runs on. (Read as lost, the workload was stopped and the session later
// adopted from its last checkpoint, losing the edits since.)
func TestRenewTakesBackItsOwnKeyAtANewerRevision(t *testing.T) {
	e := newDriverEnv(t)
	id := e.watchSession(t, contract.Status{Kind: contract.StatusStarting}, nil)
	e.command(t, bus.CmdStartSubject(id), id)
	e.waitStatus(t, id, contract.StatusRunning)
	ctx := context.Background()
	owners, err := e.js.KeyValue(ctx, bus.BucketOwners)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := owners.Get(ctx, id)
	if err != nil || string(cur.Value()) != "driver-test" {
		t.Fatalf("owner key = %v, %v; want driver-test", cur, err)
	}
	bumped, err := owners.Put(ctx, id, []byte("driver-test"))
	if err != nil {
		t.Fatal(err)
	}
	// Watch the key for three owner TTLs: it must stay this driver's.
	var last uint64
	var problem string
	testkit.Poll(ctx, 3*3*time.Second, func() bool {
		cur, err := owners.Get(ctx, id)
		switch {
		case err != nil:
			problem = "owner key after the bump: " + err.Error() + " (the driver stopped renewing it)"
		case string(cur.Value()) != "driver-test":
			problem = "owner key = " + string(cur.Value()) + ", want driver-test"
		default:
			last = cur.Revision()
		}
		return problem != ""
	})
	if problem != "" {
		t.Fatal(problem)
	}
	if last <= bumped+1 {
		t.Fatalf("owner key revision %d after three TTLs, bumped to %d: the driver stopped renewing", last, bumped)
	}
	if e.status(t, id).Kind != contract.StatusRunning {
		t.Fatalf("status = %+v, want running", e.status(t, id))
	}
}
