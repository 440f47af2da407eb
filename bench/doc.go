// Package bench holds telorunner's benchmarks. They run against real
// pieces only: an in-process JetStream or the all-in-one, the service and
// workspace-server binaries built from this repository, real HTTP, SSE and
// WebSocket clients. Every figure is printed with the number of samples it
// rests on (n=), and a percentile only when its samples support it
// (stats_test.go). Only some benchmarks have a baseline measured in the
// same run (the checkpoint's reference snapshot, the reconnect storm's
// previous reader, create at 10 retained sessions); docs/design/performance.md
// (Benchmarks) lists which.
//
//	go test -run TestPrintCheckpointBytes -v ./...   # the table
//	go test -run '^$' -bench . -benchtime=3x -v ./... # the benchmarks
package bench
