package contract

import "strings"

// PathError reports a bundle, app-entry or workspace path that fails
// normalization (contract section 8.2). The HTTP layer answers it with
// 400 invalid_bundle or 400 invalid_path depending on the route.
type PathError struct {
	// Input is the raw path as the client sent it.
	Input string
}

// Error returns the contract's message, "invalid bundle relativePath '<input>'".
func (e *PathError) Error() string {
	return "invalid bundle relativePath '" + e.Input + "'"
}

// NormalizePath turns a client-supplied POSIX-style path into the relative
// path every filesystem or container operation must use (contract 8.2).
//
// The input is split on "/"; empty and "." segments are dropped and each ".."
// removes the segment before it. For an absolute input a ".." at the root is
// discarded; for a relative input an unresolvable ".." survives, and the
// result is then rejected. Leading slashes are stripped, so "/etc/x" becomes
// "etc/x". Backslash is an ordinary character.
//
// It returns a *PathError when the result would be empty or contain a ".."
// segment, and also (stricter than the reference, as 8.2 recommends) when the
// input ends in "/" or contains a NUL byte. A successful result is never
// absolute, has no empty, "." or ".." segment, and normalizes to itself.
func NormalizePath(p string) (string, error) {
	if p == "" || strings.HasSuffix(p, "/") || strings.IndexByte(p, 0) >= 0 {
		return "", &PathError{Input: p}
	}
	absolute := p[0] == '/'
	segs := make([]string, 0, strings.Count(p, "/")+1)
	for seg := range strings.SplitSeq(p, "/") {
		switch {
		case seg == "" || seg == ".":
			// Dropped.
		case seg != "..":
			segs = append(segs, seg)
		case len(segs) > 0 && segs[len(segs)-1] != "..":
			segs = segs[:len(segs)-1]
		case !absolute:
			// Unresolvable in a relative path: kept, and rejected below.
			segs = append(segs, seg)
		}
		// An unresolvable ".." in an absolute path is discarded at the root.
	}
	if len(segs) == 0 || segs[0] == ".." {
		// Every surviving ".." is leading: inner ones were resolved above.
		return "", &PathError{Input: p}
	}
	return strings.Join(segs, "/"), nil
}
