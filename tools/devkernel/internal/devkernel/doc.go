// Package devkernel is a test double for the Telo CLI ("the kernel").
//
// It speaks the runner-facing half of the kernel contract (contract sections
// 10.1–10.8): the `telo run` command line, the inspection endpoint with its
// debug wire (`/events`, `/json/version`), the Kernel.* lifecycle frames the
// run projection consumes, Kernel.PortsResolved, watch-mode reloads of the
// entry manifest, declared ports that answer, a TTY report in the banner and a
// stdin echo. It is not a Telo implementation: it understands only
// `metadata.name`, `ports:` and its own `x-devkernel:` block of a manifest.
//
// Main is the whole program; cmd/devkernel only wires it to the process.
// docs/devkernel.md is the written contract.
package devkernel
