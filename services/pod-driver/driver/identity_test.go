package driver

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/testkit"
)

func TestLoadConfigOwnerTTL(t *testing.T) {
	c, err := LoadConfig(lookup(map[string]string{}))
	if err != nil || c.OwnerTTL != 15*time.Second {
		t.Fatalf("default OwnerTTL = %v, %v; want 15s", c.OwnerTTL, err)
	}
	c, err = LoadConfig(lookup(map[string]string{"RUNNER_OWNER_TTL_MS": "2000"}))
	if err != nil || c.OwnerTTL != 2*time.Second {
		t.Fatalf("OwnerTTL = %v, %v; want 2s", c.OwnerTTL, err)
	}
	for _, bad := range []string{"0", "299", "x", "600001"} {
		if _, err := LoadConfig(lookup(map[string]string{"RUNNER_OWNER_TTL_MS": bad})); err == nil || !strings.Contains(err.Error(), "RUNNER_OWNER_TTL_MS") {
			t.Errorf("RUNNER_OWNER_TTL_MS=%s: err = %v, want one naming the variable", bad, err)
		}
	}
}

// A driver keeps its identity across restarts on one work directory; a
// second live driver there gets another; a fixed id held by a live driver
// is refused; the identity of a driver that died is found dead.
func TestClaimIdentity(t *testing.T) {
	dir := t.TempDir()
	first, err := claimIdentity(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	second, err := claimIdentity(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if second.ID == first.ID || len(second.Dead) != 0 {
		t.Fatalf("second live driver = %q dead %v, want a new identity beside %q and no dead one", second.ID, second.Dead, first.ID)
	}
	if _, err := claimIdentity(dir, first.ID); err == nil || !strings.Contains(err.Error(), "RUNNER_DRIVER_ID") {
		t.Fatalf("fixed id held by a live driver: err = %v, want a refusal naming RUNNER_DRIVER_ID", err)
	}
	second.release() // the second driver stops
	again, err := claimIdentity(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != second.ID {
		t.Fatalf("restarted driver = %q, want its previous identity %q", again.ID, second.ID)
	}
	again.release()
	first.release()
	fixed, err := claimIdentity(dir, "driver-fixed")
	if err != nil {
		t.Fatal(err)
	}
	defer fixed.release()
	slices.Sort(fixed.Dead)
	want := []string{first.ID, second.ID}
	slices.Sort(want)
	if fixed.ID != "driver-fixed" || !slices.Equal(fixed.Dead, want) {
		t.Fatalf("fixed driver = %q dead %v, want driver-fixed with dead %v", fixed.ID, fixed.Dead, want)
	}
}

// A lock taken by another process is released by the kernel when that
// process is killed with SIGKILL: the identity is then found dead.
func TestClaimIdentityAfterKill(t *testing.T) {
	dir := t.TempDir()
	id, err := claimIdentity(dir, "driver-victim")
	if err != nil {
		t.Fatal(err)
	}
	id.release()
	// Another process holds the same lock until it is killed: the shell
	// locks its fd 9 with flock(1), then becomes sleep holding that fd — one
	// process, so the kill releases the lock. (`flock -o file sleep` forks:
	// under load its child still held the descriptor when the parent was
	// killed, and the lock outlived the kill.)
	holder := exec.Command("sh", "-c", `exec 9>"$1" && flock -x 9 && exec sleep 600`, "sh", dir+"/"+identitiesDirName+"/driver-victim.lock")
	if err := holder.Start(); err != nil {
		t.Fatalf("start flock: %v", err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	// Ready when the lock is held and the holder is sleep itself: until
	// then flock(1), a child of the shell, may still be alive with the
	// descriptor and would outlive the kill.
	testkit.Eventually(t, 10*time.Second, func() bool {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", holder.Process.Pid))
		if strings.TrimSpace(string(comm)) != "sleep" {
			return false
		}
		probe, err := claimIdentity(dir, "driver-victim")
		if err != nil {
			return true // held by the other process
		}
		probe.release()
		return false
	}, "the other process never held the lock")
	if err := holder.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = holder.Wait()
	other, err := claimIdentity(dir, "driver-other")
	if err != nil {
		t.Fatal(err)
	}
	defer other.release()
	if !slices.Equal(other.Dead, []string{"driver-victim"}) {
		t.Fatalf("dead after kill -9 of the holder = %v, want [driver-victim]", other.Dead)
	}
}
