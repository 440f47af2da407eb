package devkernel

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// DefaultInspectAddr is the inspection address used by a bare --inspect.
const DefaultInspectAddr = "127.0.0.1:9230"

const defaultInspectHost, defaultInspectPort = "127.0.0.1", "9230"

// Options is the parsed command line.
type Options struct {
	// Path is the manifest file or a directory holding telo.yaml.
	Path string
	// Watch reloads on changes of the entry file.
	Watch bool
	// Inspect is true when --inspect was given; InspectAddr is then the
	// host:port to listen on.
	Inspect     bool
	InspectAddr string
	// AppArgs are the tokens after the path that devkernel does not know;
	// they belong to the application and are ignored.
	AppArgs []string
	// Help is true for -h/--help.
	Help bool
}

// ErrUsage marks command-line errors.
var ErrUsage = errors.New("usage")

// Usage is the one-paragraph help text.
const Usage = `usage: devkernel [run] [--watch] [--inspect[=[host:]port]] [--no-open]
                 [--no-cache-write] [--debug] [--registry-url <url>]
                 <manifest.yaml | dir> [app args...]`

// ParseArgs parses the `telo` command line the runner passes: an optional
// `run` command, flags before or after the path, and unknown tokens after the
// path (the application's arguments). Errors wrap ErrUsage.
func ParseArgs(args []string) (Options, error) {
	var o Options
	if len(args) > 0 && args[0] == "run" {
		args = args[1:]
	}
	pathSeen := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, hasValue := strings.Cut(a, "=")
		switch {
		case a == "--":
			rest := args[i+1:]
			if !pathSeen && len(rest) > 0 {
				o.Path, pathSeen, rest = rest[0], true, rest[1:]
			}
			o.AppArgs = append(o.AppArgs, rest...)
			i = len(args)
		case a == "-h" || a == "--help":
			o.Help = true
		case a == "--watch" || a == "--no-open" || a == "--no-cache-write" || a == "--debug":
			o.Watch = o.Watch || a == "--watch"
		case name == "--inspect":
			if !hasValue && i+1 < len(args) && isInspectValue(args[i+1]) {
				i++
				value, hasValue = args[i], true
			}
			addr, err := parseInspectValue(value)
			if err != nil {
				return Options{}, fmt.Errorf("%w: --inspect: %w", ErrUsage, err)
			}
			o.Inspect, o.InspectAddr = true, addr
		case name == "--registry-url":
			if !hasValue {
				if i+1 >= len(args) {
					return Options{}, fmt.Errorf("%w: --registry-url needs a value", ErrUsage)
				}
				i++
			}
		case pathSeen:
			o.AppArgs = append(o.AppArgs, a)
		case strings.HasPrefix(a, "-") && a != "-":
			return Options{}, fmt.Errorf("%w: unknown flag %s before the path", ErrUsage, a)
		default:
			o.Path, pathSeen = a, true
		}
	}
	if !pathSeen && !o.Help {
		return Options{}, fmt.Errorf("%w: missing manifest path", ErrUsage)
	}
	return o, nil
}

// isInspectValue reports whether a token following a bare --inspect is its
// value: all digits, host:digits, [ipv6]:digits, localhost or an IP literal.
// Anything else (typically the manifest path) is left alone.
func isInspectValue(s string) bool {
	if isDigits(s) || s == "localhost" || net.ParseIP(s) != nil {
		return true
	}
	if strings.HasPrefix(s, "[") {
		host, port, ok := strings.Cut(s[1:], "]:")
		return ok && net.ParseIP(host) != nil && isDigits(port)
	}
	host, port, ok := strings.Cut(s, ":")
	return ok && host != "" && !strings.ContainsAny(host, "/[]") && isDigits(port)
}

// parseInspectValue turns an --inspect value into host:port. Forms: empty,
// port, host, host:port, [ipv6]:port (and a bare IPv6 literal as a host).
func parseInspectValue(v string) (string, error) {
	host, port := defaultInspectHost, defaultInspectPort
	switch {
	case v == "":
	case isDigits(v):
		port = v
	case net.ParseIP(v) != nil:
		host = v
	case strings.HasPrefix(v, "["):
		h, rest, ok := strings.Cut(v[1:], "]")
		if !ok || net.ParseIP(h) == nil {
			return "", fmt.Errorf("bad address %q", v)
		}
		host = h
		if rest != "" {
			p, ok := strings.CutPrefix(rest, ":")
			if !ok || !isDigits(p) {
				return "", fmt.Errorf("bad address %q", v)
			}
			port = p
		}
	case strings.Contains(v, ":"):
		h, p, _ := strings.Cut(v, ":")
		if h == "" || !isDigits(p) {
			return "", fmt.Errorf("bad address %q", v)
		}
		host, port = h, p
	default:
		host = v
	}
	n, err := strconv.Atoi(port)
	if err != nil || n > 65535 {
		return "", fmt.Errorf("bad port %q", port)
	}
	return net.JoinHostPort(host, strconv.Itoa(n)), nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
