// Package bench holds telorunner's benchmarks. They run against real
// pieces only: an in-process JetStream and the workspace-server binary
// built from this repository, talked to over HTTP. Each figure is printed
// beside a baseline measured in the same run (design §8).
//
//	go test -run TestPrintCheckpointBytes -v ./...   # the table
//	go test -run '^$' -bench . ./...                 # the benchmarks
package bench
