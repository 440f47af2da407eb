package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/telorunner/telorunner/pkg/contract"
)

// groupsDirName is the directory under the work root that holds one
// record per live process group. It starts with a dot, so it can never
// collide with a session directory (session ids are base32).
const groupsDirName = ".groups"

// GroupRecord is one process group of a workload, recorded on the local
// disk as soon as its leader starts and removed once the leader is reaped,
// so a driver that starts after a crash can find what its predecessor left
// running and end it. Pids are per machine, so the records live beside the
// session directories (RUNNER_WORK_DIR), not in JetStream.
type GroupRecord struct {
	Session string `json:"session"`
	// Role is "workspace", "agent" or "app-<name>" (watch sessions) or the
	// app name (run sessions).
	Role string `json:"role"`
	// PID is the leader's pid, which is also the process group id.
	PID int `json:"pid"`
	// Start is the leader's start time (clock ticks since boot,
	// /proc/<pid>/stat field 22): with it a reused pid is never mistaken
	// for the recorded process.
	Start uint64 `json:"start"`
	// Driver is the identity of the driver that started the group.
	Driver string `json:"driver"`
}

func (b *Backend) groupsDir() string { return filepath.Join(b.root, groupsDirName) }

func (b *Backend) groupPath(session string, pid int) string {
	return filepath.Join(b.groupsDir(), session+"."+strconv.Itoa(pid)+".json")
}

// track records p's process group durably. A process whose record cannot
// be written is killed: an unrecorded group would outlive a crash.
func (b *Backend) track(session, role string, p *proc) error {
	start, err := procStartTime(p.pgid)
	if err == nil {
		rec := GroupRecord{Session: session, Role: role, PID: p.pgid, Start: start, Driver: b.opts.Owner}
		err = writeFileAtomic(b.groupPath(session, p.pgid), rec)
	}
	if err != nil {
		return fmt.Errorf("record process group %d: %w", p.pgid, err)
	}
	return nil
}

// untrack removes p's record once its leader was reaped.
func (b *Backend) untrack(session string, p *proc) {
	if err := os.Remove(b.groupPath(session, p.pgid)); err != nil && !errors.Is(err, os.ErrNotExist) {
		b.log.Warn("remove process group record", "session", session, "pgid", p.pgid, "err", err)
	}
}

// writeFileAtomic writes v as JSON to path through a temporary file and a
// rename, so a reader (or a crash) never sees half a record. No fsync: the
// records guard against a process crash, and after a machine crash every
// recorded process is gone anyway.
func writeFileAtomic(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Groups lists every recorded process group on this machine's work root
// (unreadable records are skipped and removed).
func (b *Backend) Groups() ([]GroupRecord, error) { return b.groups("") }

// groups is Groups, of one session only when session is set: only its
// records are read (their names start with its id), so a session's start
// costs the same however many others run.
func (b *Backend) groups(session string) ([]GroupRecord, error) {
	entries, err := os.ReadDir(b.groupsDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list process group records: %w", err)
	}
	var out []GroupRecord
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") || session != "" && !strings.HasPrefix(e.Name(), session+".") {
			continue
		}
		path := filepath.Join(b.groupsDir(), e.Name())
		data, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		var rec GroupRecord
		if err != nil || json.Unmarshal(data, &rec) != nil || !contract.ValidSessionID(rec.Session) || rec.PID <= 1 {
			b.log.Warn("discard unreadable process group record", "file", e.Name())
			_ = os.Remove(path) // garbage: nothing can be verified from it
			continue
		}
		out = append(out, rec)
	}
	return out, nil
}

// ReapSession ends every recorded process group of session id that a
// previous workload left (its driver died) and removes their records. A
// group whose leader's start time differs from the record is a reused pid
// and is never signalled. It returns how many groups were still running.
// The caller must own the session; a workload this backend runs for id is
// never touched.
func (b *Backend) ReapSession(id string) int {
	if b.isLive(id) {
		return 0
	}
	return b.reapSession(id)
}

// reapSession is ReapSession for a start that registered id already and
// has started nothing yet.
func (b *Backend) reapSession(id string) int {
	recs, err := b.groups(id)
	if err != nil {
		b.log.Warn("reap session", "session", id, "err", err)
		return 0
	}
	n := 0
	for _, r := range recs {
		if r.Session == id && b.reapGroup(r) {
			n++
		}
	}
	return n
}

// ReapOrphans ends every recorded process group whose session this
// backend does not run and keep does not claim (keep sees each record:
// true means another live driver on this machine still runs it). It
// returns the sessions it ended groups of.
func (b *Backend) ReapOrphans(keep func(GroupRecord) bool) ([]string, error) {
	recs, err := b.Groups()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var reaped []string
	for _, r := range recs {
		if b.isLive(r.Session) || keep(r) {
			continue
		}
		if b.reapGroup(r) && !seen[r.Session] {
			seen[r.Session] = true
			reaped = append(reaped, r.Session)
		}
	}
	return reaped, nil
}

func (b *Backend) isLive(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.live[id] != nil
}

// reapGoneTimeout bounds the wait for a killed group to be gone.
const reapGoneTimeout = 5 * time.Second

// reapGroup kills the recorded group if it is still the recorded one,
// waits until it is gone and removes the record. It reports whether
// anything was running.
func (b *Backend) reapGroup(r GroupRecord) bool {
	defer func() {
		if err := os.Remove(b.groupPath(r.Session, r.PID)); err != nil && !errors.Is(err, os.ErrNotExist) {
			b.log.Warn("remove process group record", "session", r.Session, "pgid", r.PID, "err", err)
		}
	}()
	members := groupMembers(r)
	if len(members) == 0 {
		return false
	}
	for _, pid := range members {
		_ = unix.Kill(pid, unix.SIGKILL) // ESRCH: gone meanwhile
	}
	deadline := time.Now().Add(reapGoneTimeout)
	for len(groupMembers(r)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	b.log.Info("reaped a process group left by a lost workload", "session", r.Session, "role", r.Role, "pgid", r.PID, "processes", len(members))
	return true
}

// groupMembers lists the live (not zombie) processes of the recorded group
// that are provably its own: the leader when its start time matches, and
// every process in process group r.PID that started no earlier than the
// leader. Linux does not reuse a number while a process group of that id
// exists, so members found after the leader died still belong to it.
// When the leader's pid now names another process (start time differs),
// the group is not ours and nothing is returned.
func groupMembers(r GroupRecord) []int {
	if st, err := procStat(r.PID); err == nil && st.start != r.Start {
		return nil // a reused pid: not ours, never signalled
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := procStat(pid)
		if err != nil || st.state == 'Z' || st.pgid != r.PID || st.start < r.Start {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// stat is the part of /proc/<pid>/stat the reaper reads.
type stat struct {
	state byte
	pgid  int
	start uint64
}

// procStartTime is pid's start time (field 22 of /proc/<pid>/stat).
func procStartTime(pid int) (uint64, error) {
	st, err := procStat(pid)
	return st.start, err
}

// procStat parses /proc/<pid>/stat. The command name (field 2) may hold
// spaces and parentheses, so fields are counted after its last ')'.
func procStat(pid int) (stat, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, err
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return stat{}, fmt.Errorf("parse /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 20 {
		return stat{}, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f)+2)
	}
	pgid, err := strconv.Atoi(f[2]) // field 5
	if err != nil {
		return stat{}, fmt.Errorf("parse /proc/%d/stat pgrp: %w", pid, err)
	}
	start, err := strconv.ParseUint(f[19], 10, 64) // field 22
	if err != nil {
		return stat{}, fmt.Errorf("parse /proc/%d/stat starttime: %w", pid, err)
	}
	return stat{state: f[0][0], pgid: pgid, start: start}, nil
}
