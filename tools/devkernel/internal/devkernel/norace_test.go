//go:build !race

package devkernel

const raceEnabled = false
