package iopump

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
)

func TestPumpCoalescesSplitsAndKeepsTags(t *testing.T) {
	s := testkit.StartJetStream(t)
	testkit.Provision(t, s, bus.Limits{})
	_, js := testkit.Connect(t, s, bus.RoleDriver)
	ctx := context.Background()
	log := bus.NewLog(js, bus.StreamIO, 1<<30)
	subject := bus.IOSubject("aaaaaaaaaaaa", "app")
	p := New(log, subject, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))

	// Many small writes, a large one, and interleaved tags.
	var wantOut, wantErr bytes.Buffer
	for i := range 2000 {
		b := []byte{byte('a' + i%26), '\n'}
		p.Write(1, b)
		wantOut.Write(b)
	}
	big := bytes.Repeat([]byte("x"), 200_000)
	p.Write(1, big)
	wantOut.Write(big)
	p.Write(2, []byte("oops\n"))
	wantErr.WriteString("oops\n")
	p.Write(1, []byte("tail\n"))
	wantOut.WriteString("tail\n")
	p.Close()
	p.Write(1, []byte("after close is dropped"))

	tail, err := log.Tail(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	r, err := log.Read(ctx, subject, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var gotOut, gotErr bytes.Buffer
	var lastTag byte = 255
	var order []byte
	for seq := uint64(1); seq <= tail; seq++ {
		e, _, _, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if len(e.Data) < 2 || len(e.Data)-1 > MaxChunk {
			t.Fatalf("entry %d payload %d bytes, want 1..%d", e.Seq, len(e.Data)-1, MaxChunk)
		}
		switch e.Data[0] {
		case 1:
			gotOut.Write(e.Data[1:])
		case 2:
			gotErr.Write(e.Data[1:])
		default:
			t.Fatalf("tag %d", e.Data[0])
		}
		if e.Data[0] != lastTag {
			order = append(order, e.Data[0])
			lastTag = e.Data[0]
		}
	}
	if !bytes.Equal(gotOut.Bytes(), wantOut.Bytes()) || gotErr.String() != wantErr.String() {
		t.Fatalf("stdout %d bytes (want %d), stderr %q (want %q)", gotOut.Len(), wantOut.Len(), gotErr.String(), wantErr.String())
	}
	if string(order) != "\x01\x02\x01" {
		t.Fatalf("tag order = %v, want stdout, stderr, stdout", order)
	}
	// 2000 two-byte writes plus 200 KB cannot take fewer than 4 entries, and
	// coalescing keeps it far below one entry per write.
	if tail < 4 || tail > 200 {
		t.Fatalf("%d entries for 2003 writes, want coalescing into a few", tail)
	}
}
