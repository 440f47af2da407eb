// Package hubtest is a stand-in for Docker Hub's tag API (an external edge
// of the runner) for tests of the base-image menu: an HTTP server serving
// GET /v2/repositories/<namespace>/<repo>/tags paginated like Docker Hub,
// whose tags and failures a test sets.
package hubtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Hub is a fake tag API. URL is its base URL (RUNNER_BASE_IMAGE_API_URL).
type Hub struct {
	URL string

	mu       sync.Mutex
	repos    map[string][]tag // namespace/repo → tags in serving order
	failing  bool
	failPage int       // fail only this page (0: every page) while failing
	queries  []url.URL // every request, in order
}

type tag struct {
	Name        string    `json:"name"`
	LastUpdated time.Time `json:"last_updated"`
}

// New starts a hub closed when t ends.
func New(t testing.TB) *Hub {
	h := &Hub{repos: map[string][]tag{}}
	srv := httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(srv.Close)
	h.URL = srv.URL
	return h
}

// SetTags makes repo (namespace/repo) list names, newest first: names[0]
// is given the latest last_updated. They are served in that order.
func (h *Hub) SetTags(repo string, names ...string) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tags := make([]tag, len(names))
	for i, n := range names {
		tags[i] = tag{Name: n, LastUpdated: base.Add(-time.Duration(i) * time.Minute)}
	}
	h.mu.Lock()
	h.repos[repo] = tags
	h.mu.Unlock()
}

// SetServed makes repo list names in the given serving order with the given
// last_updated times (tests of the menu's own sorting).
func (h *Hub) SetServed(repo string, names []string, updated []time.Time) {
	tags := make([]tag, len(names))
	for i, n := range names {
		tags[i] = tag{Name: n, LastUpdated: updated[i]}
	}
	h.mu.Lock()
	h.repos[repo] = tags
	h.mu.Unlock()
}

// Fail makes every request (page 0) or only requests of one page answer
// 503 until Fail(false, 0).
func (h *Hub) Fail(on bool, page int) {
	h.mu.Lock()
	h.failing, h.failPage = on, page
	h.mu.Unlock()
}

// Queries returns the query strings of every request so far.
func (h *Hub) Queries() []url.Values {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]url.Values, len(h.queries))
	for i, u := range h.queries {
		out[i] = u.Query()
	}
	return out
}

// Requests returns how many requests the hub has answered.
func (h *Hub) Requests() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.queries)
}

func (h *Hub) serve(w http.ResponseWriter, r *http.Request) {
	repo, ok := strings.CutPrefix(r.URL.Path, "/v2/repositories/")
	repo, ok2 := strings.CutSuffix(repo, "/tags")
	page, _ := strconv.Atoi(r.URL.Query().Get("page"))
	size, _ := strconv.Atoi(r.URL.Query().Get("page_size"))
	if page < 1 {
		page = 1
	}
	if size < 1 {
		size = 10 // Docker Hub's default
	}
	h.mu.Lock()
	h.queries = append(h.queries, *r.URL)
	fail := h.failing && (h.failPage == 0 || h.failPage == page)
	tags, known := h.repos[repo]
	h.mu.Unlock()
	switch {
	case r.Method != http.MethodGet || !ok || !ok2:
		http.NotFound(w, r)
		return
	case fail:
		http.Error(w, `{"message":"unavailable"}`, http.StatusServiceUnavailable)
		return
	case !known:
		http.Error(w, `{"message":"object not found"}`, http.StatusNotFound)
		return
	}
	lo := min((page-1)*size, len(tags))
	hi := min(lo+size, len(tags))
	var next *string
	if hi < len(tags) {
		q := r.URL.Query()
		q.Set("page", strconv.Itoa(page+1))
		s := fmt.Sprintf("http://%s%s?%s", r.Host, r.URL.Path, q.Encode())
		next = &s
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"count": len(tags), "next": next, "previous": nil, "results": tags[lo:hi]})
}
