package local

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kernelwire"
)

// orphan starts `sh -c 'sleep 600 & exec sleep 600'` as the leader of its own
// process group — a lost workload's group: a leader and a child — and
// returns the leader's pid. The test reaps its own child at the end.
func orphan(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "sleep 600 & exec sleep 600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	poll(t, "the orphan's child", func() bool { return len(members(pid)) == 2 })
	return pid
}

// members lists the live processes of process group pgid.
func members(pgid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := procStat(pid); err == nil && st.pgid == pgid && st.state != 'Z' {
			out = append(out, pid)
		}
	}
	return out
}

func record(t *testing.T, b *Backend, r GroupRecord) {
	t.Helper()
	if err := writeFileAtomic(b.groupPath(r.Session, r.PID), r); err != nil {
		t.Fatal(err)
	}
}

// Boot reaping ends only groups that are provably the recorded ones: a
// record whose pid now names a process with another start time (a reused
// pid) is dropped without a signal; a group a live driver claims is kept;
// a dead workload's group goes, the leader and its child.
func TestReapOrphansKillsOnlyRecordedGroups(t *testing.T) {
	b := newBackend(t, nil)
	dead, reused, claimed := orphan(t), orphan(t), orphan(t)
	start := func(pid int) uint64 {
		s, err := procStartTime(pid)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	deadKids := members(dead)
	s1, s2, s3 := contract.NewSessionID(), contract.NewSessionID(), contract.NewSessionID()
	record(t, b, GroupRecord{Session: s1, Role: "workspace", PID: dead, Start: start(dead), Driver: "gone"})
	record(t, b, GroupRecord{Session: s2, Role: "app-web", PID: reused, Start: start(reused) - 1, Driver: "gone"})
	record(t, b, GroupRecord{Session: s3, Role: "app-web", PID: claimed, Start: start(claimed), Driver: "alive"})

	reaped, err := b.ReapOrphans(func(r GroupRecord) bool { return r.Driver == "alive" })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(reaped, []string{s1}) {
		t.Errorf("reaped sessions = %v, want only %s", reaped, s1)
	}
	for _, pid := range deadKids {
		if st, err := procStat(pid); err == nil && st.state != 'Z' {
			t.Errorf("process %d of the dead group still runs", pid)
		}
	}
	if got := members(reused); len(got) != 2 {
		t.Errorf("group with a reused pid: live members %v, want both untouched", got)
	}
	if got := members(claimed); len(got) != 2 {
		t.Errorf("group a live driver claims: live members %v, want both untouched", got)
	}
	recs, err := b.Groups()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Session != s3 {
		t.Errorf("records left = %+v, want only the claimed group's", recs)
	}
}

// A process group whose leader is gone still has members: they are ended
// when they started after the recorded leader (the group id cannot be
// reused while they exist).
func TestReapSessionEndsMembersOfAGoneLeader(t *testing.T) {
	b := newBackend(t, nil)
	// The leader exits at once; its child stays in the group.
	cmd := exec.Command("/bin/sh", "-c", "sleep 600 & exit 0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	st, err := procStartTime(pgid)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	if len(members(pgid)) != 1 {
		t.Fatalf("members of %d = %v, want the orphaned child", pgid, members(pgid))
	}
	id := contract.NewSessionID()
	record(t, b, GroupRecord{Session: id, Role: "app-web", PID: pgid, Start: st, Driver: "gone"})
	if n := b.ReapSession(id); n != 1 {
		t.Errorf("ReapSession = %d, want 1", n)
	}
	if got := members(pgid); len(got) != 0 {
		t.Errorf("members after reap = %v, want none", got)
	}
}

// Reaping one session reads only that session's records: another
// session's record, even an unreadable one, is not opened (Groups would
// remove it), so a start costs the same however many sessions run here.
func TestReapSessionReadsOnlyItsRecords(t *testing.T) {
	b := newBackend(t, nil)
	pgid := orphan(t)
	st, err := procStartTime(pgid)
	if err != nil {
		t.Fatal(err)
	}
	id, other := contract.NewSessionID(), contract.NewSessionID()
	record(t, b, GroupRecord{Session: id, Role: "app-web", PID: pgid, Start: st, Driver: "gone"})
	garbage := b.groupPath(other, 4242)
	if err := os.WriteFile(garbage, []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n := b.ReapSession(id); n != 1 {
		t.Errorf("ReapSession = %d, want 1", n)
	}
	if got := members(pgid); len(got) != 0 {
		t.Errorf("members of the session's group after reap = %v, want none", got)
	}
	if _, err := os.Stat(garbage); err != nil {
		t.Errorf("another session's record was read (and removed as garbage): %v", err)
	}
	if _, err := b.Groups(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(garbage); err == nil {
		t.Error("Groups left an unreadable record in place")
	}
}

// Every process of a live workload is recorded with its start time and
// driver, and the records go with the processes.
func TestWorkloadGroupsAreRecorded(t *testing.T) {
	b := newWatchBackend(t, func(o *Options) { o.Owner = "driver-a" })
	rec := newRecorder()
	spec := webWorker(0)
	w := startWatch(t, b, spec, rec)
	rec.waitEvents(t, "worker", "Kernel.Started", 1)
	recs, err := b.Groups()
	if err != nil {
		t.Fatal(err)
	}
	var roles []string
	for _, r := range recs {
		if r.Session != spec.SessionID || r.Driver != "driver-a" {
			t.Errorf("record %+v, want session %s driver driver-a", r, spec.SessionID)
		}
		if st, err := procStartTime(r.PID); err != nil || st != r.Start {
			t.Errorf("record %+v: start time on /proc = %d, %v", r, st, err)
		}
		roles = append(roles, r.Role)
	}
	slices.Sort(roles)
	if want := []string{"app-web", "app-worker", "workspace"}; !slices.Equal(roles, want) {
		t.Errorf("recorded roles = %v, want %v", roles, want)
	}
	stop(t, w)
	if recs, _ := b.Groups(); len(recs) != 0 {
		t.Errorf("records after stop = %+v, want none", recs)
	}
}

// Recovery on the same machine: a lost watch workload left its session
// directory (with edits) and a running process group. A start with
// KeepWorkspace ends the group, serves the directory as it is (no seed:
// the bundle is empty) and records the new processes; without an intact
// directory KeepWorkspace fails, and a plain start seeds the bundle.
func TestStartKeepsALostWorkspace(t *testing.T) {
	b := newWatchBackend(t, func(o *Options) { o.Owner = "driver-b" })
	spec := webWorker(0)
	id := spec.SessionID
	// What a driver that died left behind.
	dir := filepath.Join(b.root, id)
	for p, c := range map[string]string{
		"workspace/" + kernelwire.MarkerPath: kernelwire.MarkerContent,
		"workspace/web/telo.yaml":            manifest("web", nil),
		"workspace/worker/telo.yaml":         manifest("worker", nil),
		"workspace/notes/edit.txt":           "edited after the last checkpoint\n",
		driverFileName:                       "driver-a\n",
	} {
		path := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	lost := orphan(t)
	st, _ := procStartTime(lost)
	record(t, b, GroupRecord{Session: id, Role: "workspace", PID: lost, Start: st, Driver: "driver-a"})

	if b.WorkspaceIntact(id, "driver-c") {
		t.Error("WorkspaceIntact with another last driver = true, want false (stale directory)")
	}
	if !b.WorkspaceIntact(id, "driver-a") {
		t.Fatal("WorkspaceIntact(driver-a) = false, want true")
	}
	keep := spec
	keep.Bundle = contract.Bundle{}
	keep.KeepWorkspace = true
	rec := newRecorder()
	w := startWatch(t, b, keep, rec)
	if got := members(lost); len(got) != 0 {
		t.Errorf("lost group after the recovery start: %v still run", got)
	}
	base := rec.wsURL(t)
	if paths := treePaths(t, base); !slices.Contains(paths, "notes/edit.txt") {
		t.Errorf("tree after recovery = %v, want the edit kept", paths)
	}
	rec.waitEvents(t, "web", "Kernel.Started", 1)
	stamp, _ := os.ReadFile(filepath.Join(dir, driverFileName))
	if strings.TrimSpace(string(stamp)) != "driver-b" {
		t.Errorf("driver stamp = %q, want driver-b", stamp)
	}
	stop(t, w)

	// Nothing intact: KeepWorkspace fails, a plain start seeds the bundle.
	if _, err := b.Start(t.Context(), keep, newRecorder()); err == nil {
		t.Fatal("Start with KeepWorkspace and no directory succeeded")
	} else if se, ok := err.(*backend.StartError); !ok || se.Stage != "create" {
		t.Fatalf("Start error = %v, want a create StartError", err)
	}
	rec = newRecorder()
	w = startWatch(t, b, spec, rec)
	if paths := treePaths(t, rec.wsURL(t)); slices.Contains(paths, "notes/edit.txt") {
		t.Errorf("seeded tree = %v, want the bundle only", paths)
	}
	stop(t, w)
}
