package checkpoint

import (
	"context"
	"fmt"
)

// Blob returns the stored content of hash (lowercase or uppercase hex
// SHA-256), checked against it: ErrMissingBlob when the store does not
// hold it. A restore that streams a manifest into a workspace (the
// driver's seeding) fetches each distinct hash once with it, instead of
// Files' path-ordered windows.
func (s *Store) Blob(ctx context.Context, hash string) ([]byte, error) {
	h, ok := normalHash(hash)
	if !ok {
		return nil, fmt.Errorf("blob %q: not 64 hex digits of SHA-256", hash)
	}
	return s.blob(ctx, h)
}
