package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"unicode/utf8"
)

// Terms is the usage agreement clients must accept (contract section 16).
// Its JSON form is the "terms" object of /v1/capabilities and of 428 bodies.
type Terms struct {
	Version string `json:"version"`
	Title   string `json:"title"`
	Body    string `json:"body"`
}

var errNotUTF8 = errors.New("terms body is not valid UTF-8")

// terms reads RUNNER_TERMS_FILE once when set, else RUNNER_TERMS_BODY. The
// body is kept verbatim (the default version hashes it exactly); a blank body
// means no terms.
func (p *parser) terms() *Terms {
	var body, from string
	if path := p.str("RUNNER_TERMS_FILE"); path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			p.fail("RUNNER_TERMS_FILE", err)
			return nil
		}
		body, from = string(b), "RUNNER_TERMS_FILE"
	} else {
		body, _ = p.Lookup("RUNNER_TERMS_BODY")
		from = "RUNNER_TERMS_BODY"
	}
	if strings.TrimSpace(body) == "" {
		return nil
	}
	if !utf8.ValidString(body) {
		p.fail(from, errNotUTF8)
		return nil
	}
	t := &Terms{Version: termsVersion(body), Title: DefaultTermsTitle, Body: body}
	p.text("RUNNER_TERMS_VERSION", &t.Version)
	p.text("RUNNER_TERMS_TITLE", &t.Title)
	return t
}

// termsVersion is the default version: the first 12 hex characters of the
// SHA-256 of the body, so any edit re-prompts every client.
func termsVersion(body string) string {
	sum := sha256.Sum256([]byte(body))
	return hex.EncodeToString(sum[:])[:12]
}
