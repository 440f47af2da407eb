package baseimage

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Options configure a Menu.
type Options struct {
	Default string        // the runner's default image, always first
	Repo    string        // Docker Hub namespace/repo whose tags are offered
	Filter  Filter        // which tags, how many
	APIURL  string        // tag API base URL (https://hub.docker.com)
	Refresh time.Duration // cadence of Run
	Client  *http.Client  // nil: http.DefaultClient
	Logger  *slog.Logger  // nil: slog.Default()
}

// Menu is the current list of offered images. It starts as the default
// image alone; each successful Refresh replaces it and a failed one keeps
// the last good list. Safe for concurrent use.
type Menu struct {
	opts Options

	mu     sync.RWMutex
	images []string // guarded by mu; never empty
}

// New returns a menu offering only o.Default until its first Refresh.
func New(o Options) (*Menu, error) {
	if o.Default == "" || o.Repo == "" || o.APIURL == "" || o.Refresh <= 0 {
		return nil, errors.New("baseimage: Default, Repo, APIURL and a positive Refresh are required")
	}
	if o.Client == nil {
		o.Client = http.DefaultClient
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Menu{opts: o, images: []string{o.Default}}, nil
}

// Images returns the menu: the default image, then the offered tags as
// repo:tag, newest first. The caller owns the slice.
func (m *Menu) Images() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Clone(m.images)
}

// Allows reports whether image is on the menu.
func (m *Menu) Allows(image string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Contains(m.images, image)
}

// Refresh fetches the tags and replaces the menu. On error the menu keeps
// its last good list.
func (m *Menu) Refresh(ctx context.Context) error {
	tags, err := FetchTags(ctx, m.opts.Client, m.opts.APIURL, m.opts.Repo)
	if err != nil {
		return err
	}
	names := make([]string, len(tags))
	for i, t := range tags {
		names[i] = t.Name
	}
	images := Images(m.opts.Default, m.opts.Repo, m.opts.Filter.Apply(names))
	m.mu.Lock()
	m.images = images
	m.mu.Unlock()
	return nil
}

// Run refreshes the menu every Refresh until ctx ends, logging a failure
// as a warning (the last good list stays).
func (m *Menu) Run(ctx context.Context) {
	t := time.NewTicker(m.opts.Refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := m.Refresh(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			m.opts.Logger.Warn("base-image menu refresh failed; keeping the last good list", "err", err, "images", len(m.Images()))
			continue
		}
		m.opts.Logger.Info("base-image menu refreshed", "images", len(m.Images()))
	}
}
