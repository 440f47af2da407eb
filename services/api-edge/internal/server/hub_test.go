package server

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
)

// A client too slow for its live buffer loses nothing: the hole is filled
// from the log, ids stay contiguous, and the stream still ends on the
// terminal status.
func TestSSESlowClientRepairsFromLog(t *testing.T) {
	old := sseFollowBuffer
	sseFollowBuffer = 2
	defer func() { sseFollowBuffer = old }()
	e := newEnv(t, nil)
	id := e.do(t, "POST", "/v1/sessions", validCreate(), nil).created(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/sessions/"+id+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	const n = 400
	go func() {
		for i := range n {
			if _, err := e.store.Emit(context.Background(), id, contract.Event{Type: contract.EventProgress, Phase: "boot", Message: fmt.Sprint(i)}); err != nil {
				t.Error(err)
				return
			}
		}
		if _, err := e.store.SetStatus(context.Background(), id, contract.Status{Kind: contract.StatusStopped}, nil); err != nil {
			t.Error(err)
		}
	}()
	sc := bufio.NewScanner(resp.Body)
	var ids []string
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "id: ") {
			ids = append(ids, l[4:])
			if len(ids)%50 == 0 {
				time.Sleep(20 * time.Millisecond) //nolint:forbidigo // be a slow client on purpose
			}
		}
	}
	if len(ids) != n+1 {
		t.Fatalf("got %d events, want %d", len(ids), n+1)
	}
	for i, got := range ids {
		if want := fmt.Sprint(i + 1); got != want {
			t.Fatalf("event %d id = %s, want %s", i, got, want)
		}
	}
}
