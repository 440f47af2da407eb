//go:build linux

package bench

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// BenchmarkIOThroughputProcess is BenchmarkIOThroughput with the runner
// as its own process (the all-in-one binary: edge, driver and embedded
// NATS), so runner-MB/cpu-s counts the runner's CPU only — not the client,
// nor the kernel (a separate process). MB are MiB.
func BenchmarkIOThroughputProcess(b *testing.B) {
	const size = 64 << 20
	p := startProc(b, map[string]string{"RUNNER_REPLAY_BUFFER_BYTES": "100000000"})
	r := runner{url: p.url}
	b.SetBytes(size)
	b.ResetTimer()
	var wall, cpu time.Duration
	for range b.N {
		man := fmt.Sprintf("kind: Telo.Application\nmetadata:\n  name: flood\nx-devkernel:\n  outputBytes: %d\n  exitAfterMs: 1\n", size)
		id := r.create(b, runSession(man, false))
		c, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(r.url, "http")+"/v1/sessions/"+id+"/io", http.Header{"Origin": {r.url}})
		if err != nil {
			b.Fatal(err)
		}
		t0, c0 := time.Now(), procCPU(b, p.cmd.Process.Pid)
		got := 0
		for got < size {
			kind, data, err := c.ReadMessage()
			if err != nil {
				b.Fatalf("after %d bytes: %v", got, err)
			}
			if kind == websocket.BinaryMessage {
				got += len(data) - 5
			}
		}
		wall += time.Since(t0)
		cpu += procCPU(b, p.cmd.Process.Pid) - c0
		_ = c.Close()
	}
	mb := float64(size*b.N) / (1 << 20)
	b.ReportMetric(mb/wall.Seconds(), "MB/s")
	b.ReportMetric(mb/cpu.Seconds(), "runner-MB/cpu-s")
}

// procCPU is a process's own user+system CPU time (not its children's).
func procCPU(tb testing.TB, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the command name (which ends with the last ')').
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}
