package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoChange, returned by an Update mutator, leaves the record as it is.
var ErrNoChange = errors.New("no change")

// GetJSON reads key and decodes it into a T, returning its revision.
// A missing key is jetstream.ErrKeyNotFound.
func GetJSON[T any](ctx context.Context, kv jetstream.KeyValue, key string) (T, uint64, error) {
	var v T
	e, err := kv.Get(ctx, key)
	if err != nil {
		return v, 0, err
	}
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return v, 0, fmt.Errorf("decode %s: %w", key, err)
	}
	return v, e.Revision(), nil
}

// CreateJSON writes v under key only if the key does not exist
// (jetstream.ErrKeyExists otherwise).
func CreateJSON(ctx context.Context, kv jetstream.KeyValue, key string, v any) (uint64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("encode %s: %w", key, err)
	}
	return kv.Create(ctx, key, b)
}

// UpdateJSON applies mutate to the current value of key and writes it back
// with compare-and-set on the revision, re-reading and retrying on a
// conflict. mutate may run several times and must only change the value it
// is given. If create is true a missing key starts from the zero T;
// otherwise a missing key is jetstream.ErrKeyNotFound. When mutate returns
// ErrNoChange nothing is written and the current value is returned.
func UpdateJSON[T any](ctx context.Context, kv jetstream.KeyValue, key string, create bool, mutate func(*T) error) (T, uint64, error) {
	for {
		v, rev, err := GetJSON[T](ctx, kv, key)
		missing := errors.Is(err, jetstream.ErrKeyNotFound)
		if err != nil && !(missing && create) {
			return v, 0, err
		}
		if err := mutate(&v); err != nil {
			if errors.Is(err, ErrNoChange) {
				return v, rev, nil
			}
			return v, rev, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return v, 0, fmt.Errorf("encode %s: %w", key, err)
		}
		if missing {
			rev, err = kv.Create(ctx, key, b)
		} else {
			rev, err = kv.Update(ctx, key, b, rev)
		}
		if err == nil {
			return v, rev, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !isWrongLastSeq(err) {
			return v, 0, fmt.Errorf("update %s: %w", key, err)
		}
		if err := ctx.Err(); err != nil {
			return v, 0, err
		}
	}
}

// PurgeFamily purges key and every key one token below it (key.*), absent
// ones being success: a record and its children (a session's checkpoint
// and its history slots).
func PurgeFamily(ctx context.Context, kv jetstream.KeyValue, key string) error {
	if err := kv.Purge(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("purge %s: %w", key, err)
	}
	l, err := kv.ListKeysFiltered(ctx, key+".*")
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s.*: %w", key, err)
	}
	var keys []string
	for k := range l.Keys() {
		keys = append(keys, k)
	}
	_ = l.Stop() // Already stopped once every key was listed.
	for _, k := range keys {
		if err := kv.Purge(ctx, k); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("purge %s: %w", k, err)
		}
	}
	return nil
}
