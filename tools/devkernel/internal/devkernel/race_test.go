//go:build race

package devkernel

// raceEnabled builds the devkernel binary under test with -race too, so the
// process tests catch races inside the kernel, not only in the test code.
const raceEnabled = true
