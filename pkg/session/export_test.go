package session

import "github.com/nats-io/nats.go/jetstream"

// SetAfterStatusCAS installs a hook that runs between a status transition
// and the append of its event (a writer dying there).
func SetAfterStatusCAS(s *Store, f func() error) { s.afterStatusCAS = f }

// AdmissionBucket is s's admission bucket, for tests that read or plant
// its keys.
func AdmissionBucket(s *Store) jetstream.KeyValue { return s.admission }
