// Package run owns goroutine lifecycles: a Group runs named functions that
// share one context, cancels them all when the first fails or the parent
// ends, and waits for them; Shutdown gives a graceful window before
// returning regardless.
package run

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// Group runs functions until the first error or cancellation.
type Group struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	err    error
}

// NewGroup returns a group whose context derives from parent.
func NewGroup(parent context.Context) *Group {
	ctx, cancel := context.WithCancel(parent)
	return &Group{ctx: ctx, cancel: cancel}
}

// Context is the group's context, cancelled when any member fails.
func (g *Group) Context() context.Context { return g.ctx }

// Go starts fn. A non-nil error other than context.Canceled cancels the
// group and is reported by Wait.
func (g *Group) Go(name string, fn func(ctx context.Context) error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := fn(g.ctx); err != nil && !errors.Is(err, context.Canceled) {
			g.once.Do(func() { g.err = fmt.Errorf("%s: %w", name, err) })
			g.cancel()
		}
	}()
}

// Cancel stops every member.
func (g *Group) Cancel() { g.cancel() }

// Wait blocks until every member returned and reports the first failure.
func (g *Group) Wait() error {
	g.wg.Wait()
	g.cancel()
	return g.err
}

// WaitTimeout waits like Wait, but gives up after grace (hard shutdown),
// returning an error naming the timeout.
func (g *Group) WaitTimeout(grace time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(grace):
		return fmt.Errorf("shutdown: members still running after %v", grace)
	}
}

// SignalContext is cancelled on SIGINT or SIGTERM.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
