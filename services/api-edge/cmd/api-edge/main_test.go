package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMain runs main instead of the tests when the test binary is started
// as the command (TestBadBaseImageRegexExits2).
func TestMain(m *testing.M) {
	if os.Getenv("API_EDGE_TEST_MAIN") == "1" {
		os.Args = os.Args[:1]
		main()
		return
	}
	os.Exit(m.Run())
}

// An invalid RUNNER_BASE_IMAGE_INCLUDE or _EXCLUDE is a fatal
// configuration error: the message names the variable, exit status 2
// (contract 18, 18.2).
func TestBadBaseImageRegexExits2(t *testing.T) {
	for _, name := range []string{"RUNNER_BASE_IMAGE_INCLUDE", "RUNNER_BASE_IMAGE_EXCLUDE"} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "API_EDGE_TEST_MAIN=1", name+"=(unclosed", "RUNNER_NATS_URL=nats://127.0.0.1:1")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), name+":") {
			t.Errorf("api-edge with %s=(unclosed: %v, output %q; want exit status 2 naming the variable", name, err, out)
		}
	}
}
