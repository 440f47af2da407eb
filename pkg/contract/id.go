package contract

import "crypto/rand"

// sessionIDAlphabet is the lowercase RFC 4648 base32 alphabet (contract 5.1).
const sessionIDAlphabet = "abcdefghijklmnopqrstuvwxyz234567"

// SessionIDLen is the length of every session id.
const SessionIDLen = 12

// NewSessionID returns a fresh session id: 12 characters where character i
// is the alphabet entry at randomByte_i mod 32, drawn from crypto/rand
// (about 60 bits of entropy, unbiased because 256 is a multiple of 32).
// It does not check for collisions; the registry should re-draw on one.
func NewSessionID() string {
	var b [SessionIDLen]byte
	// crypto/rand.Read never returns an error since Go 1.24; it crashes the
	// program instead when the system source fails.
	_, _ = rand.Read(b[:])
	for i, c := range b {
		b[i] = sessionIDAlphabet[c%32]
	}
	return string(b[:])
}

// ValidSessionID reports whether s has the session id shape ^[a-z2-7]{12}$.
// It says nothing about whether such a session exists.
func ValidSessionID(s string) bool {
	if len(s) != SessionIDLen {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}
