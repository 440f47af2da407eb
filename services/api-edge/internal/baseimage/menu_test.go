package baseimage_test

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/api-edge/internal/baseimage"
	"github.com/telorunner/telorunner/services/api-edge/internal/baseimage/hubtest"
)

const def = "telorun/node:latest-slim"

func newMenu(t *testing.T, hub *hubtest.Hub, f baseimage.Filter) *baseimage.Menu {
	t.Helper()
	m, err := baseimage.New(baseimage.Options{Default: def, Repo: "telorun/node", Filter: f, APIURL: hub.URL, Refresh: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var contractFilter = baseimage.Filter{PinnedOnly: true, ExcludeSHA: true, ExcludePrerelease: true, Limit: 20}

func TestFetchTagsPaginatesUpTo200(t *testing.T) {
	hub := hubtest.New(t)
	names := make([]string, 250)
	for i := range names {
		names[i] = fmt.Sprintf("0.%d.0", 250-i)
	}
	hub.SetTags("telorun/node", names...)
	tags, err := baseimage.FetchTags(context.Background(), http.DefaultClient, hub.URL, "telorun/node")
	if err != nil {
		t.Fatalf("FetchTags() error = %v", err)
	}
	if len(tags) != 200 || tags[0].Name != "0.250.0" || tags[199].Name != "0.51.0" {
		t.Fatalf("FetchTags() = %d tags, first %q last %q; want 200 from 0.250.0 to 0.51.0", len(tags), tags[0].Name, tags[len(tags)-1].Name)
	}
	q := hub.Queries()
	if len(q) != 2 {
		t.Fatalf("requests = %d, want 2 pages of 100", len(q))
	}
	for i, v := range q {
		if v.Get("page_size") != "100" || v.Get("page") != fmt.Sprint(i+1) || v.Get("ordering") != "last_updated" {
			t.Errorf("request %d query = %v, want page_size=100 page=%d ordering=last_updated", i, v, i+1)
		}
	}
}

func TestFetchTagsSortsByLastUpdated(t *testing.T) {
	hub := hubtest.New(t)
	at := func(m int) time.Time { return time.Date(2026, 1, 1, 0, m, 0, 0, time.UTC) }
	hub.SetServed("library/node", []string{"1.0.0", "3.0.0", "2.0.0"}, []time.Time{at(1), at(3), at(2)})
	tags, err := baseimage.FetchTags(context.Background(), http.DefaultClient, hub.URL, "node")
	if err != nil {
		t.Fatalf("FetchTags(node) error = %v", err)
	}
	var got []string
	for _, tg := range tags {
		got = append(got, tg.Name)
	}
	if want := []string{"3.0.0", "2.0.0", "1.0.0"}; !reflect.DeepEqual(got, want) {
		t.Errorf("FetchTags(node) = %q, want %q (newest first, official image under library/)", got, want)
	}
}

func TestFetchTagsFailures(t *testing.T) {
	hub := hubtest.New(t)
	hub.SetTags("telorun/node", make150()...)
	hub.Fail(true, 2)
	if _, err := baseimage.FetchTags(context.Background(), http.DefaultClient, hub.URL, "telorun/node"); err == nil || !strings.Contains(err.Error(), "page 2") {
		t.Errorf("FetchTags() with page 2 failing error = %v, want an error naming page 2", err)
	}
	if _, err := baseimage.FetchTags(context.Background(), http.DefaultClient, hub.URL, "nobody/nothing"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("FetchTags(unknown repo) error = %v, want a 404 error", err)
	}
}

func TestMenuRefresh(t *testing.T) {
	hub := hubtest.New(t)
	m := newMenu(t, hub, contractFilter)
	if got, want := m.Images(), []string{def}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Images() before any refresh = %q, want %q", got, want)
	}
	ctx := context.Background()

	// A failed first refresh leaves the default alone.
	hub.Fail(true, 0)
	if err := m.Refresh(ctx); err == nil {
		t.Fatal("Refresh() with the hub failing = nil, want an error")
	}
	if got, want := m.Images(), []string{def}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Images() after a failed first refresh = %q, want %q", got, want)
	}

	hub.Fail(false, 0)
	hub.SetTags("telorun/node", "latest-slim", "0.31.0-rc.1", "0.30.1-slim", "abcdef12", "0.30.1")
	if err := m.Refresh(ctx); err != nil {
		t.Fatalf("Refresh() error = %v", err)
	}
	first := []string{def, "telorun/node:0.30.1-slim", "telorun/node:0.30.1"}
	if got := m.Images(); !reflect.DeepEqual(got, first) {
		t.Fatalf("Images() = %q, want %q", got, first)
	}
	if !m.Allows("telorun/node:0.30.1") || !m.Allows(def) || m.Allows("telorun/node:0.31.0-rc.1") {
		t.Errorf("Allows() disagrees with Images() %q", first)
	}

	// A failure keeps the last good list.
	hub.Fail(true, 0)
	if err := m.Refresh(ctx); err == nil {
		t.Fatal("Refresh() with the hub failing = nil, want an error")
	}
	if got := m.Images(); !reflect.DeepEqual(got, first) {
		t.Fatalf("Images() after a failed refresh = %q, want the last good %q", got, first)
	}

	// A refresh that changes the menu.
	hub.Fail(false, 0)
	hub.SetTags("telorun/node", "0.32.0", "0.30.1")
	if err := m.Refresh(ctx); err != nil {
		t.Fatalf("Refresh() error = %v", err)
	}
	if got, want := m.Images(), []string{def, "telorun/node:0.32.0", "telorun/node:0.30.1"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Images() after the tags changed = %q, want %q", got, want)
	}
	if m.Allows("telorun/node:0.30.1-slim") {
		t.Error("Allows(0.30.1-slim) = true after it left the menu")
	}
}

func TestMenuRunRefreshes(t *testing.T) {
	hub := hubtest.New(t)
	hub.SetTags("telorun/node", "1.0.0")
	m, err := baseimage.New(baseimage.Options{Default: def, Repo: "telorun/node", Filter: contractFilter, APIURL: hub.URL, Refresh: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	want := []string{def, "telorun/node:1.0.0"}
	if !testkit.Poll(ctx, 5*time.Second, func() bool { return reflect.DeepEqual(m.Images(), want) }) {
		t.Fatalf("Images() = %q after 5s of Run, want %q", m.Images(), want)
	}
}

func TestNewRequiresOptions(t *testing.T) {
	if _, err := baseimage.New(baseimage.Options{Default: def, Repo: "telorun/node", APIURL: "http://x"}); err == nil {
		t.Error("New() without Refresh = nil error, want an error")
	}
}

func make150() []string {
	out := make([]string, 150)
	for i := range out {
		out[i] = fmt.Sprintf("1.0.%d", i)
	}
	return out
}
