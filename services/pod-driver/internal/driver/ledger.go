package driver

import (
	"context"
	"errors"

	"github.com/telorunner/telorunner/pkg/session"
)

// ledger persists generations in the session record.
type ledger struct{ o *owned }

func (l ledger) OpenGeneration(app string) (int, string, error) {
	var gen int
	var trigger string
	_, err := l.o.store.Update(context.Background(), l.o.id, func(r *session.Record) error {
		a, ok := r.App(app)
		if !ok {
			return errors.New("no app " + app)
		}
		a.Generation++
		gen, trigger = a.Generation, a.Trigger
		a.Trigger = ""
		return nil
	})
	return gen, trigger, err
}
