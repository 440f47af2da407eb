// Package decode reads the edge's request bodies the way the reference
// runner's JSON-Schema validation does (lenient.go: numeric strings become
// integers, "true"/"false" booleans, a lone value a one-item array, unknown
// fields ignored), and names the offending property in a *SchemaError,
// which the edge answers as 400 invalid_request. It knows nothing of HTTP
// or gin, so it is fuzzed on its own (FuzzDecodeCreate).
package decode
