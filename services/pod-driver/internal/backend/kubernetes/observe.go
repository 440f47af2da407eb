package kubernetes

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/podspec"
)

// rearmDelay is the pause before re-arming a pod watch that could not be
// armed (11.13).
const rearmDelay = 2 * time.Second

// observe follows one pod: it reads it, then watches it (field selector on
// its name) and calls fn with every state seen; pod is nil once it is gone.
// When a watch closes it reconciles with one read and re-arms. It returns
// when fn returns true or ctx ends (with ctx's error).
func (b *Backend) observe(ctx context.Context, name string, fn func(pod *corev1.Pod) bool) error {
	pods := b.client.CoreV1().Pods(b.opts.Namespace)
	for {
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			if fn(nil) {
				return nil
			}
		case err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			b.log.Warn("read pod", "pod", name, "err", err)
			if !sleep(ctx, rearmDelay) {
				return ctx.Err()
			}
			continue
		default:
			if fn(pod) {
				return nil
			}
		}
		rv := ""
		if pod != nil {
			rv = pod.ResourceVersion
		}
		w, err := pods.Watch(ctx, metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
			ResourceVersion: rv,
		})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			b.log.Warn("watch pod", "pod", name, "err", err)
			if !sleep(ctx, rearmDelay) {
				return ctx.Err()
			}
			continue
		}
		if done := drain(ctx, w, fn); done {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// drain feeds one watch's events to fn until it closes, fn is done or ctx
// ends.
func drain(ctx context.Context, w watch.Interface, fn func(*corev1.Pod) bool) bool {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false
			}
			switch ev.Type {
			case watch.Deleted:
				if fn(nil) {
					return true
				}
			case watch.Added, watch.Modified:
				if pod, ok := ev.Object.(*corev1.Pod); ok && fn(pod) {
					return true
				}
			case watch.Error:
				return false // reconcile and re-arm
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// provisionMessage describes a pending pod for `provision` progress (6.6):
// the first container waiting reason, else the pod phase.
func provisionMessage(pod *corev1.Pod) string {
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, cs := range list {
			if w := cs.State.Waiting; w != nil && w.Reason != "" {
				switch w.Reason {
				case "ContainerCreating", "PodInitializing":
					return "Starting containers"
				case "ErrImagePull", "ImagePullBackOff":
					return "Pulling image: " + w.Reason
				default:
					return "Waiting: " + w.Reason
				}
			}
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return "Waiting for a node"
		}
	}
	if pod.Spec.NodeName == "" {
		return "Scheduling pod"
	}
	return "Pod " + strings.ToLower(string(pod.Status.Phase))
}

const maxMessage = 500

func truncate(s string) string {
	s = strings.TrimSpace(s)
	if r := []rune(s); len(r) > maxMessage {
		return string(r[:maxMessage]) + "…"
	}
	return s
}

// podFailureMessage explains a failed pod (contract 11.13): init
// containers then containers, state then lastState, first problem wins.
func podFailureMessage(pod *corev1.Pod) string {
	scan := func(kind string, list []corev1.ContainerStatus) string {
		for _, cs := range list {
			for _, st := range []corev1.ContainerState{cs.State, cs.LastTerminationState} {
				if t := st.Terminated; t != nil && t.ExitCode != 0 {
					msg := fmt.Sprintf("%s %q failed: ", kind, cs.Name)
					if t.Reason != "" {
						msg += t.Reason + " "
					}
					msg += fmt.Sprintf("(exit code %d)", t.ExitCode)
					if m := truncate(t.Message); m != "" {
						msg += ": " + m
					}
					return msg
				}
				if w := st.Waiting; w != nil && w.Reason != "" && w.Reason != "PodInitializing" && w.Reason != "ContainerCreating" {
					msg := fmt.Sprintf("%s %q waiting: %s", kind, cs.Name, w.Reason)
					if m := truncate(w.Message); m != "" {
						msg += ": " + m
					}
					return msg
				}
			}
		}
		return ""
	}
	if m := scan("init container", pod.Status.InitContainerStatuses); m != "" {
		return m
	}
	if m := scan("container", pod.Status.ContainerStatuses); m != "" {
		return m
	}
	if m := truncate(pod.Status.Message); m != "" {
		return m
	}
	if pod.Status.Reason != "" {
		return pod.Status.Reason
	}
	return "pod failed"
}

// firstExitCode is the first container's terminated exit code (11.13:
// default 0).
func firstExitCode(pod *corev1.Pod) int {
	// The session container by name, not the first status (19 item 37).
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == podspec.ContainerSession && cs.State.Terminated != nil {
			return int(cs.State.Terminated.ExitCode)
		}
	}
	return 0
}

// endReason is the RunEnded reason of a terminated watch container
// (contract 10.5.4).
func endReason(t *corev1.ContainerStateTerminated) string {
	if t.Reason == "" || t.Reason == "Completed" {
		return fmt.Sprintf("application container exited (code %d)", t.ExitCode)
	}
	return fmt.Sprintf("application container %s (exit code %d)", t.Reason, t.ExitCode)
}
