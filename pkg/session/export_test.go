package session

// SetAfterStatusCAS installs a hook that runs between a status transition
// and the append of its event (a writer dying there).
func SetAfterStatusCAS(s *Store, f func() error) { s.afterStatusCAS = f }
