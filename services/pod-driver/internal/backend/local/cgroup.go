package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// cgroupV1 holds the memory and pids ceilings of sandboxes in the cgroup
// v1 hierarchies (memory, pids) when this runner can write them (root).
// Each sandboxed process gets a group of its own under
// telorunner-<runner pid>/ in both; stage 1 joins them before it builds
// the sandbox, so everything in it is charged. A memory overrun is killed
// by the kernel (SIGKILL: exit 137), as a container is (OOMKilled).
type cgroupV1 struct {
	memory, pids string // telorunner-<pid> directories
	seq          atomic.Uint64
}

// cgroupParents numbers the backends of this process (tests run several).
var cgroupParents atomic.Uint64

// cgroupV1Root is where the v1 hierarchies are mounted.
const cgroupV1Root = "/sys/fs/cgroup"

// newCgroupV1 creates this runner's parent groups; nil when the
// hierarchies are absent or not writable.
func newCgroupV1() (*cgroupV1, error) {
	removeStaleCgroups()
	name := "telorunner-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatUint(cgroupParents.Add(1), 10)
	c := &cgroupV1{memory: filepath.Join(cgroupV1Root, "memory", name), pids: filepath.Join(cgroupV1Root, "pids", name)}
	for _, dir := range []string{c.memory, c.pids} {
		if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "cgroup.procs")); err != nil {
			return nil, fmt.Errorf("cgroup v1 %s hierarchy: %w", filepath.Base(filepath.Dir(dir)), err)
		}
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create cgroup %s: %w", dir, err)
		}
	}
	return c, nil
}

// group creates one sandbox's groups with its ceilings and returns the
// cgroup.procs files stage 1 joins and a remove for after it ended.
func (c *cgroupV1) group(memory int64, procs int) (join []string, remove func(), err error) {
	name := strconv.FormatUint(c.seq.Add(1), 10)
	mem, pids := filepath.Join(c.memory, name), filepath.Join(c.pids, name)
	remove = func() { removeCgroups(mem, pids) }
	for _, dir := range []string{mem, pids} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			remove()
			return nil, nil, fmt.Errorf("create cgroup: %w", err)
		}
	}
	writes := [][2]string{{filepath.Join(pids, "pids.max"), strconv.Itoa(procs)}}
	if memory > 0 {
		v := strconv.FormatInt(memory, 10)
		writes = append(writes, [2]string{filepath.Join(mem, "memory.limit_in_bytes"), v})
		if _, err := os.Stat(filepath.Join(mem, "memory.memsw.limit_in_bytes")); err == nil {
			writes = append(writes, [2]string{filepath.Join(mem, "memory.memsw.limit_in_bytes"), v}) // no swapping past it
		}
	}
	for _, w := range writes {
		if err := os.WriteFile(w[0], []byte(w[1]), 0o644); err != nil {
			remove()
			return nil, nil, fmt.Errorf("set cgroup limit: %w", err)
		}
	}
	return []string{filepath.Join(mem, "cgroup.procs"), filepath.Join(pids, "cgroup.procs")}, remove, nil
}

// removeCgroups removes emptied groups. The namespace's last processes
// may take a moment to leave after its init died.
func removeCgroups(dirs ...string) {
	for _, dir := range dirs {
		for i := 0; i < 50; i++ {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// close removes this runner's parent groups (empty once every workload
// ended).
func (c *cgroupV1) close() {
	if c != nil {
		removeCgroups(c.memory, c.pids)
	}
}

// removeStaleCgroups removes the groups runners that are gone left behind
// (a kill -9 leaves them; their processes are reaped at the next boot):
// telorunner-<pid>-<n> of a pid that no longer exists. A group still
// holding a process is not removable and stays.
func removeStaleCgroups() {
	for _, h := range []string{"memory", "pids"} {
		parents, _ := filepath.Glob(filepath.Join(cgroupV1Root, h, "telorunner-*-*"))
		for _, parent := range parents {
			f := strings.Split(filepath.Base(parent), "-")
			pid, err := strconv.Atoi(f[1])
			if err != nil || pid == os.Getpid() {
				continue
			}
			if _, err := os.Stat(filepath.Join("/proc", f[1])); err == nil {
				continue // that runner lives
			}
			children, _ := os.ReadDir(parent)
			for _, c := range children {
				if c.IsDir() {
					_ = os.Remove(filepath.Join(parent, c.Name())) // EBUSY while a process is left
				}
			}
			_ = os.Remove(parent)
		}
	}
}
