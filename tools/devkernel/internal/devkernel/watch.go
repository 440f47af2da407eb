package devkernel

import (
	"context"
	"time"

	"golang.org/x/sys/unix"
)

// Watch timing: the entry file is polled, and a change is reported once the
// file has been stable for WatchDebounce.
const (
	WatchPoll     = 50 * time.Millisecond
	WatchDebounce = 100 * time.Millisecond
)

// fileState is what the watcher compares. ctime and inode make a rewrite of
// identical bytes and an atomic rename-over both count as changes.
type fileState struct {
	exists bool
	size   int64
	mtime  int64
	ctime  int64
	ino    uint64
	dev    uint64
}

func statFile(path string) fileState {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return fileState{}
	}
	return fileState{
		exists: true,
		size:   st.Size,
		mtime:  st.Mtim.Nano(),
		ctime:  st.Ctim.Nano(),
		ino:    uint64(st.Ino),
		dev:    uint64(st.Dev), // int32 on some platforms
	}
}

// Watcher polls one file and reports debounced changes.
type Watcher struct {
	path     string
	poll     time.Duration
	debounce time.Duration
	base     fileState
}

// NewWatcher takes the baseline state of path now, so a change made right
// after NewWatcher returns is seen. Zero durations mean WatchPoll and
// WatchDebounce.
func NewWatcher(path string, poll, debounce time.Duration) *Watcher {
	if poll <= 0 {
		poll = WatchPoll
	}
	if debounce <= 0 {
		debounce = WatchDebounce
	}
	return &Watcher{path: path, poll: poll, debounce: debounce, base: statFile(path)}
}

// Run polls until ctx ends. Each time the file, having differed from the
// last reported state, stays stable for the debounce period, Run sends on
// changes without blocking (a change already pending in the channel absorbs
// the new one). A disappearance alone is not reported; the reappearance is.
// Run must not be called twice at once.
func (w *Watcher) Run(ctx context.Context, changes chan<- struct{}) {
	var (
		pending bool
		last    fileState
		since   time.Time
	)
	t := time.NewTicker(w.poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			cur := statFile(w.path)
			switch {
			case !pending:
				if cur != w.base {
					pending, last, since = true, cur, now
				}
			case cur != last:
				last, since = cur, now
			case now.Sub(since) >= w.debounce:
				pending = false
				changed := cur != w.base
				w.base = cur
				if changed && cur.exists {
					select {
					case changes <- struct{}{}:
					default:
					}
				}
			}
		}
	}
}
