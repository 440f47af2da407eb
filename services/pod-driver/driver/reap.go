package driver

import (
	"context"
	"errors"
	"log/slog"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/local"
)

// reapLocalOrphans ends, at boot, every process group recorded on this
// work directory that no live driver runs: a group is kept only while its
// session's owner key names the driver that started it and that driver is
// alive (another driver on this machine). Groups of this driver's previous
// run and of dead drivers go — their live sessions are recovered by the
// takeover that follows, under new processes. Failures are warnings.
func reapLocalOrphans(ctx context.Context, lb *local.Backend, store *session.Store, ident *identity, log *slog.Logger) {
	owners := map[string]string{}
	owner := func(id string) string {
		if o, ok := owners[id]; ok {
			return o
		}
		o := ""
		if holder, _, err := store.Owner(ctx, id); err == nil {
			o = holder
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			o = "?" // unknown: keep the group rather than kill a live one
		}
		owners[id] = o
		return o
	}
	reaped, err := lb.ReapOrphans(func(r local.GroupRecord) bool {
		if r.Driver == ident.ID || slices.Contains(ident.Dead, r.Driver) {
			return false
		}
		o := owner(r.Session)
		return o == "?" || o == r.Driver
	})
	if err != nil {
		log.Warn("reap orphan process groups", "err", err)
	} else if len(reaped) > 0 {
		log.Info("reaped orphan process groups", "sessions", reaped)
	}
}
