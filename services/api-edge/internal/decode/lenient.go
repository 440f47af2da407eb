package decode

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The reference validates request bodies with JSON-Schema defaults that
// coerce types: numeric strings become integers, "true"/"false" become
// booleans, and a scalar becomes a one-item array. Unknown fields are
// ignored. These helpers read a decoded body the same lenient way and name
// the offending property in their errors.

type SchemaError struct{ msg string }

func (e *SchemaError) Error() string { return e.msg }

func Errorf(format string, args ...any) error {
	return &SchemaError{msg: fmt.Sprintf(format, args...)}
}

// Obj is a decoded JSON object with its path for error messages.
type Obj struct {
	Path string // where it is in the body, for error messages
	m    map[string]any
}

func Parse(data []byte, path string) (Obj, error) {
	var v any
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return Obj{}, Errorf("body is not valid JSON: %v", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return Obj{}, Errorf("body is not valid JSON: data after the top-level value")
	}
	return AsObject(v, path)
}

func AsObject(v any, path string) (Obj, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return Obj{}, Errorf("%s must be object", path)
	}
	return Obj{Path: path, m: m}, nil
}

func (o Obj) Has(key string) bool {
	v, ok := o.m[key]
	return ok && v != nil
}

func (o Obj) Missing(key string) error {
	return Errorf("%s must have required property '%s'", o.Path, key)
}

func (o Obj) Str(key string, required bool, minLen int) (string, bool, error) {
	v, ok := o.m[key]
	if !ok || v == nil {
		if required {
			return "", false, o.Missing(key)
		}
		return "", false, nil
	}
	var s string
	switch t := v.(type) {
	case string:
		s = t
	case json.Number:
		s = t.String()
	case bool:
		s = strconv.FormatBool(t)
	default:
		return "", false, Errorf("%s/%s must be string", o.Path, key)
	}
	if utf8.RuneCountInString(s) < minLen { // no copy: contents may be megabytes
		return "", false, Errorf("%s/%s must NOT have fewer than %d characters", o.Path, key, minLen)
	}
	return s, true, nil
}

func (o Obj) Integer(key string, required bool, lo, hi int) (int, bool, error) {
	v, ok := o.m[key]
	if !ok || v == nil {
		if required {
			return 0, false, o.Missing(key)
		}
		return 0, false, nil
	}
	n, ok := toInt(v)
	if !ok {
		return 0, false, Errorf("%s/%s must be integer", o.Path, key)
	}
	if n < lo || n > hi {
		return 0, false, Errorf("%s/%s must be >= %d and <= %d", o.Path, key, lo, hi)
	}
	return n, true, nil
}

func toInt(v any) (int, bool) {
	var s string
	switch t := v.(type) {
	case json.Number:
		s = t.String()
	case string:
		s = strings.TrimSpace(t)
	case bool:
		if t {
			return 1, true
		}
		return 0, true
	default:
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, false
	}
	return int(f), true
}

func (o Obj) Boolean(key string) (bool, bool, error) {
	v, ok := o.m[key]
	if !ok || v == nil {
		return false, false, nil
	}
	switch t := v.(type) {
	case bool:
		return t, true, nil
	case string:
		switch t {
		case "true":
			return true, true, nil
		case "false":
			return false, true, nil
		}
	case json.Number:
		switch t.String() {
		case "1":
			return true, true, nil
		case "0":
			return false, true, nil
		}
	}
	return false, false, Errorf("%s/%s must be boolean", o.Path, key)
}

func (o Obj) Enum(key string, required bool, allowed ...string) (string, bool, error) {
	s, ok, err := o.Str(key, required, 0)
	if err != nil || !ok {
		return s, ok, err
	}
	for _, a := range allowed {
		if s == a {
			return s, true, nil
		}
	}
	return "", false, Errorf("%s/%s must be equal to one of the allowed values", o.Path, key)
}

// passthrough reads a property no schema lists: a string as it is, any
// other value as its JSON text ("" when absent or null). It never fails.
func (o Obj) Passthrough(key string) string {
	v, ok := o.m[key]
	if !ok || v == nil {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v) // a decoded JSON value always encodes
	return string(b)
}

// array reads an array, wrapping a lone scalar or object into one item.
func (o Obj) Array(key string, required bool) ([]any, bool, error) {
	v, ok := o.m[key]
	if !ok || v == nil {
		if required {
			return nil, false, o.Missing(key)
		}
		return nil, false, nil
	}
	if a, ok := v.([]any); ok {
		return a, true, nil
	}
	return []any{v}, true, nil
}

func (o Obj) Object(key string, required bool) (Obj, bool, error) {
	v, ok := o.m[key]
	if !ok || v == nil {
		if required {
			return Obj{}, false, o.Missing(key)
		}
		return Obj{}, false, nil
	}
	ob, err := AsObject(v, o.Path+"/"+key)
	return ob, err == nil, err
}

// stringMap reads an object of string values (numbers and booleans coerced).
func (o Obj) StringMap(key string, required bool) (map[string]string, error) {
	ob, ok, err := o.Object(key, required)
	if err != nil || !ok {
		return map[string]string{}, err
	}
	out := make(map[string]string, len(ob.m))
	for k := range ob.m {
		s, _, err := ob.Str(k, true, 0)
		if err != nil {
			return nil, err
		}
		out[k] = s
	}
	return out, nil
}
