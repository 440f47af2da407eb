package bus

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// SeedFile is the name of role's nkey seed file in a credentials directory.
func SeedFile(dir, role string) string { return filepath.Join(dir, role+".nk") }

// EnsureCredentials makes sure dir (mode 0700) holds an nkey user seed
// (<role>.nk, mode 0600) for every role: existing seeds are kept, missing
// ones generated. It returns each role's public key.
func EnsureCredentials(dir string) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("credentials dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("credentials dir: %w", err)
	}
	pubs := make(map[string]string, len(Roles))
	for _, role := range Roles {
		file := SeedFile(dir, role)
		kp, err := LoadSeed(file)
		if errors.Is(err, fs.ErrNotExist) {
			kp, err = writeSeed(file)
		}
		if err != nil {
			return nil, err
		}
		if pubs[role], err = kp.PublicKey(); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
	}
	return pubs, nil
}

func writeSeed(file string) (nkeys.KeyPair, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("create nkey: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("create nkey: %w", err)
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("write seed: %w", err)
	}
	if _, err := f.Write(append(seed, '\n')); err != nil {
		f.Close()
		return nil, fmt.Errorf("write seed %s: %w", file, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("write seed %s: %w", file, err)
	}
	return kp, nil
}

// LoadSeed reads an nkey user seed file (fs.ErrNotExist when missing).
func LoadSeed(file string) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read seed: %w", err)
	}
	kp, err := nkeys.FromSeed(bytes.TrimSpace(b))
	if err != nil {
		return nil, fmt.Errorf("seed %s: %w", file, err)
	}
	return kp, nil
}

// ClientOptions are the connection options of role authenticated with kp:
// the nkey signature, the role's own inbox prefix (the only reply subjects
// it may subscribe to), and an error handler that logs the asynchronous
// permission violations a refused publish or subscribe reports (a refused
// JetStream call otherwise looks like a plain timeout).
func ClientOptions(role string, kp nkeys.KeyPair, log *slog.Logger) ([]nats.Option, error) {
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("nkey: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	return []nats.Option{
		nats.Nkey(pub, kp.Sign),
		nats.CustomInboxPrefix(InboxPrefix(role)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Error("nats async error", "role", role, "err", err)
		}),
	}, nil
}

// SeedFileOptions are ClientOptions with the seed read from file
// (RUNNER_NATS_NKEY_FILE); an empty file name connects anonymously, which
// an authenticated server refuses.
func SeedFileOptions(role, file string, log *slog.Logger) ([]nats.Option, error) {
	if file == "" {
		return nil, nil
	}
	if role == "" {
		return nil, errors.New("RUNNER_NATS_NKEY_FILE: no bus role for this service")
	}
	kp, err := LoadSeed(file)
	if err != nil {
		return nil, fmt.Errorf("RUNNER_NATS_NKEY_FILE: %w", err)
	}
	return ClientOptions(role, kp, log)
}
