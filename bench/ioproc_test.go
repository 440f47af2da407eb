//go:build linux

package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/telorunner/telorunner/pkg/testkit"
)

// BenchmarkIOThroughput: a kernel writes 64 MiB to its terminal; one editor
// (this process) receives them over the io WebSocket, every frame's seq
// checked to follow the previous one. The runner is its own process (the
// all-in-one binary: edge, driver, supervisor and embedded NATS), so CPU is
// read per process from /proc and printed per role: runner (the
// all-in-one's own CPU), client (this process), kernel (the session's
// devkernel) and the session's other processes (sandbox init, workspace
// server). runner-MiB/cpu-s divides by the runner's CPU only. One untimed
// warm-up flood first; each timed iteration runs from the create to the
// last byte read, and the session's processes are gone (DELETE) before the
// next one starts, so each iteration's processes are its own.
func BenchmarkIOThroughput(b *testing.B) {
	const size = 64 << 20
	p := startProc(b, map[string]string{"RUNNER_REPLAY_BUFFER_BYTES": "100000000"})
	r := runner{url: p.url}
	pid := p.cmd.Process.Pid
	man := fmt.Sprintf("kind: Telo.Application\nmetadata:\n  name: flood\nx-devkernel:\n  outputBytes: %d\n", size)
	// The runner has no processes of its own below it (the local sandbox's
	// start-up probe ends); each iteration starts with none.
	gone := func() {
		if !testkit.Poll(context.Background(), 30*time.Second, func() bool { return len(descendants(b, pid)) == 0 }) {
			b.Fatalf("processes below the runner 30 s on: %v", descendants(b, pid))
		}
	}
	gone()
	flood := func() (int, time.Duration, cpuSplit) {
		t0, c0 := time.Now(), snapCPU(b, pid)
		id := r.create(b, runSession(man, false))
		c, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(r.url, "http")+"/v1/sessions/"+id+"/io", http.Header{"Origin": {r.url}})
		if err != nil {
			b.Fatal(err)
		}
		got, seq := 0, uint32(0)
		for got < size {
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			kind, data, err := c.ReadMessage()
			if err != nil {
				b.Fatalf("after %d bytes: %v", got, err)
			}
			if kind != websocket.BinaryMessage {
				continue
			}
			if len(data) < 5 {
				b.Fatalf("frame of %d bytes", len(data))
			}
			if s := binary.BigEndian.Uint32(data); s != seq+1 {
				b.Fatalf("frame seq %d after %d", s, seq)
			}
			seq++
			got += len(data) - 5
		}
		wall, cpu := time.Since(t0), snapCPU(b, pid).since(c0)
		b.StopTimer()
		_ = c.Close()
		req, _ := http.NewRequest("DELETE", r.url+"/v1/sessions/"+id, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			b.Fatalf("DELETE = %d", resp.StatusCode)
		}
		gone()
		b.StartTimer()
		return got, wall, cpu
	}
	flood() // warm-up, not counted
	var bytes int
	var wall time.Duration
	var cpu cpuSplit
	var rates []string
	n := 0
	for b.Loop() {
		g, w, c := flood()
		bytes, wall, n = bytes+g, wall+w, n+1
		cpu = cpu.add(c)
		rates = append(rates, fmt.Sprintf("%.0f", float64(g)/(1<<20)/w.Seconds()))
	}
	mb := float64(bytes) / (1 << 20)
	b.ReportMetric(mb/wall.Seconds(), "MiB/s")
	b.ReportMetric(mb/cpu.runner.Seconds(), "runner-MiB/cpu-s")
	b.ReportMetric(float64(n), "n")
	b.Logf("io throughput: n=%d floods of %d MiB; MiB/s %.1f (each: %s)", n, size>>20, mb/wall.Seconds(), strings.Join(rates, " "))
	b.Logf("CPU per MiB, n=%d floods (from /proc): runner %.2f ms, client %.2f ms, kernel %.2f ms, the session's other processes (sandbox init) %.2f ms; runner-MiB/cpu-s %.1f",
		n, ms(cpu.runner)/mb, ms(cpu.client)/mb, ms(cpu.kernel)/mb, ms(cpu.other)/mb, mb/cpu.runner.Seconds())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pstat is one process's line of /proc/<pid>/stat: its parent, command
// name, own CPU (utime+stime), its reaped children's CPU (cutime+cstime),
// and start time (a reused pid is another process); for a descendant, the
// binary it runs (/proc/<pid>/exe).
type pstat struct {
	pid, ppid  int
	comm, exe  string
	self, reap time.Duration
	start      uint64
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat's times (100 on
// Linux's ABI).
const clockTick = time.Second / 100

func readStat(pid int) (pstat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return pstat{}, err
	}
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return pstat{}, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	// Fields from the state on (field 3 of proc(5)).
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 20 {
		return pstat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	var bad error
	num := func(i int) int64 {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			bad = fmt.Errorf("/proc/%d/stat field %d: %w", pid, i+3, err)
		}
		return v
	}
	st := pstat{pid: pid, ppid: int(num(1)), comm: string(b[open+1 : end]),
		self: time.Duration(num(11)+num(12)) * clockTick, reap: time.Duration(num(13)+num(14)) * clockTick, start: uint64(num(19))}
	return st, bad
}

// descendants are the live processes below root.
func descendants(tb testing.TB, root int) []pstat {
	tb.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		tb.Fatal(err)
	}
	kids := map[int][]pstat{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil {
			continue // gone meanwhile
		}
		kids[st.ppid] = append(kids[st.ppid], st)
	}
	var out []pstat
	next := []int{root}
	for len(next) > 0 {
		p := next[0]
		next = next[1:]
		for _, k := range kids[p] {
			k.exe, _ = os.Readlink(fmt.Sprintf("/proc/%d/exe", k.pid)) // empty when gone meanwhile
			out = append(out, k)
			next = append(next, k.pid)
		}
	}
	return out
}

// cpuSnap is the CPU counters of the runner, its descendants and this
// process at one moment.
type cpuSnap struct {
	runner, client pstat
	desc           map[int]pstat
}

func snapCPU(tb testing.TB, runner int) cpuSnap {
	tb.Helper()
	s := cpuSnap{desc: map[int]pstat{}}
	var err error
	if s.runner, err = readStat(runner); err != nil {
		tb.Fatal(err)
	}
	if s.client, err = readStat(os.Getpid()); err != nil {
		tb.Fatal(err)
	}
	for _, d := range descendants(tb, runner) {
		s.desc[d.pid] = d
	}
	return s
}

// cpuSplit is CPU time by role.
type cpuSplit struct{ runner, client, kernel, other time.Duration }

func (a cpuSplit) add(b cpuSplit) cpuSplit {
	return cpuSplit{a.runner + b.runner, a.client + b.client, a.kernel + b.kernel, a.other + b.other}
}

// since is the CPU each role used from s0 to s: the runner's and this
// process's own; each descendant's own and reaped children's (the kernel:
// processes running the devkernel binary, /proc/<pid>/exe); and the runner's reaped
// children (session processes that ended meanwhile) as other. Exact when
// no session process of s0 ended meanwhile (the benchmark starts each
// iteration with none).
func (s cpuSnap) since(s0 cpuSnap) cpuSplit {
	c := cpuSplit{runner: s.runner.self - s0.runner.self, client: s.client.self - s0.client.self, other: s.runner.reap - s0.runner.reap}
	for pid, d := range s.desc {
		used := d.self + d.reap
		if d0, ok := s0.desc[pid]; ok && d0.start == d.start {
			used -= d0.self + d0.reap
		}
		if d.exe == kernelBin {
			c.kernel += used
		} else {
			c.other += used
		}
	}
	return c
}
