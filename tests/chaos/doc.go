// Package chaos is the chaos suite (`make test-chaos`): the runner's
// services as separate OS processes built from this repository (2 api-edges,
// 2 pod-drivers on the local backend, 2 workspace-proxies, 2 supervisors)
// over a 3-node NATS JetStream cluster, an editor-shaped client keeping
// watch sessions busy, and kill -9 of each process kind in turn, then of one
// NATS node, then of everything at once. After each fault it checks what the
// editor would notice (docs/design/testing.md, "Chaos suite").
//
// The suite needs the binaries: TELORUNNER_BIN (the repository's bin/, from
// `make build`) and TELORUNNER_NATS_SERVER (a nats-server binary, from
// `make nats-bin`). The Makefile target sets both.
package chaos
