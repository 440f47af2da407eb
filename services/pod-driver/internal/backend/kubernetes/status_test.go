package kubernetes

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestPodFailureMessage(t *testing.T) {
	term := func(name string, code int32, reason, msg string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, Message: msg}}}
	}
	wait := func(name, reason string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}
	}
	tests := []struct {
		name string
		st   corev1.PodStatus
		want string
	}{
		{"init first", corev1.PodStatus{InitContainerStatuses: []corev1.ContainerStatus{term("fetch", 1, "Error", "")}, ContainerStatuses: []corev1.ContainerStatus{term("session", 2, "Error", "")}},
			`init container "fetch" failed: Error (exit code 1)`},
		{"container with message", corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{term("session", 137, "OOMKilled", " boom ")}},
			`container "session" failed: OOMKilled (exit code 137): boom`},
		{"zero exit skipped, waiting", corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{term("a", 0, "Completed", ""), wait("b", "ErrImagePull")}},
			`container "b" waiting: ErrImagePull`},
		{"creating is no problem", corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{wait("a", "ContainerCreating")}, Message: "deadline", Reason: "DeadlineExceeded"},
			"deadline"},
		{"reason verbatim", corev1.PodStatus{Reason: "DeadlineExceeded"}, "DeadlineExceeded"},
		{"nothing", corev1.PodStatus{}, "pod failed"},
		{"last state", corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "a", LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 3}}}}},
			`container "a" failed: (exit code 3)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := podFailureMessage(&corev1.Pod{Status: tt.st}); got != tt.want {
				t.Errorf("podFailureMessage() = %q, want %q", got, tt.want)
			}
		})
	}
	long := podFailureMessage(&corev1.Pod{Status: corev1.PodStatus{Message: strings.Repeat("é", 600)}})
	if r := []rune(long); len(r) != 501 || !strings.HasSuffix(long, "…") {
		t.Errorf("long message = %d runes, want 500 + …", len(r))
	}
}

func TestEndReasonAndTerminations(t *testing.T) {
	if got := endReason(&corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}); got != "application container exited (code 0)" {
		t.Errorf("endReason(Completed) = %q", got)
	}
	if got := endReason(&corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}); got != "application container OOMKilled (exit code 137)" {
		t.Errorf("endReason(OOMKilled) = %q", got)
	}
	cs := corev1.ContainerStatus{RestartCount: 2, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}}
	if got := terminations(cs); got != 3 {
		t.Errorf("terminations() = %d, want 3", got)
	}
}

func TestFirstExitCodeReadsTheSessionContainer(t *testing.T) {
	term := func(name string, code int32) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}
	}
	pod := &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{term("sidecar", 9), term("session", 4)}}}
	if got := firstExitCode(pod); got != 4 {
		t.Errorf("firstExitCode() = %d, want the session container's 4", got)
	}
	if got := firstExitCode(&corev1.Pod{}); got != 0 {
		t.Errorf("firstExitCode(no statuses) = %d, want 0", got)
	}
}

func TestStartDeadlines(t *testing.T) {
	for _, tt := range []struct {
		o          Options
		run, watch time.Duration
	}{
		{Options{}, 120 * time.Second, 180 * time.Second},
		{Options{RunStartDeadline: time.Minute, WatchStartDeadline: 10 * time.Minute}, time.Minute, 10 * time.Minute},
		{Options{StartDeadline: 5 * time.Second, WatchStartDeadline: 10 * time.Minute}, 5 * time.Second, 5 * time.Second},
	} {
		if got := tt.o.startDeadline(false); got != tt.run {
			t.Errorf("%+v run deadline = %v, want %v", tt.o, got, tt.run)
		}
		if got := tt.o.startDeadline(true); got != tt.watch {
			t.Errorf("%+v watch deadline = %v, want %v", tt.o, got, tt.watch)
		}
	}
}
