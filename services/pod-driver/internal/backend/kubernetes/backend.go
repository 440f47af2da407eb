package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/podspec"
)

// Backend runs session workloads as pods. It implements backend.Backend;
// its methods are safe for concurrent use.
type Backend struct {
	opts   Options
	params podspec.Params
	client k8s.Interface
	log    *slog.Logger
	namer  podspec.Namer
	// http talks to pods (relays, workspace servers), no keep-alive.
	http *http.Client

	wg sync.WaitGroup // every workload goroutine
}

var _ backend.Backend = (*Backend)(nil)

// New validates opts, applies defaults and builds the client when
// opts.Client is nil (from RestConfig with WithThrottle).
func New(opts Options) (*Backend, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.applyDefaults()
	client := opts.Client
	if client == nil {
		c, err := k8s.NewForConfig(WithThrottle(opts.RestConfig))
		if err != nil {
			return nil, fmt.Errorf("kubernetes backend: build client: %w", err)
		}
		client = c
	}
	params := opts.params()
	if err := params.Validate(); err != nil {
		return nil, fmt.Errorf("kubernetes backend: %w", err)
	}
	return &Backend{
		opts: opts, params: params, client: client, log: opts.Logger,
		http: &http.Client{Transport: &http.Transport{DisableKeepAlives: true, ResponseHeaderTimeout: 10 * time.Second}},
	}, nil
}

// Start launches spec's workload as a pod and returns once it runs
// (after sink.Running). Run and app sessions get a *Workload, watch
// sessions a *WatchWorkload. Failures are *backend.StartError and leave
// no pod behind. ctx bounds only the start.
func (b *Backend) Start(ctx context.Context, spec backend.Spec, sink backend.Sink) (backend.Workload, error) {
	if !contract.ValidSessionID(spec.SessionID) {
		return nil, &backend.StartError{Stage: "create", Message: fmt.Sprintf("invalid session id %q", spec.SessionID)}
	}
	if spec.Mode == contract.ModeWatch {
		w, err := b.startWatch(ctx, spec, sink)
		if err != nil {
			return nil, err
		}
		return w, nil
	}
	w, err := b.startRun(ctx, spec, sink)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Close waits for every workload goroutine; it does not delete pods (a
// restarted driver adopts them or reaps them). Workloads must have been
// stopped or their contexts ended first.
func (b *Backend) Close(ctx context.Context) error {
	done := make(chan struct{})
	go func() { b.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close kubernetes backend: %w", ctx.Err())
	}
}

// deletePod deletes a pod with grace 0; a missing pod is success.
func (b *Backend) deletePod(ctx context.Context, name string) error {
	err := b.client.CoreV1().Pods(b.opts.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s: %w", name, err)
	}
	return nil
}

// ReapOrphans deletes (grace 0) every managed pod whose session live
// reports false (contract 11.15; the driver passes a session-store
// check). Services, Ingresses and bundle ConfigMaps go with their owner
// pod. Failures are joined into one error; the rest are still deleted.
func (b *Backend) ReapOrphans(ctx context.Context, live func(sessionID string) bool) (reaped []string, err error) {
	sel := labels.SelectorFromSet(labels.Set{podspec.LabelManagedBy: b.opts.ManagedBy}).String()
	list, err := b.client.CoreV1().Pods(b.opts.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list session pods: %w", err)
	}
	var errs []error
	for _, pod := range list.Items {
		id := pod.Labels[podspec.LabelSession]
		if id != "" && live(id) {
			continue
		}
		if err := b.deletePod(ctx, pod.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		reaped = append(reaped, pod.Name)
	}
	return reaped, errors.Join(errs...)
}

// sessionPod finds the newest live pod of a session by label.
func (b *Backend) sessionPod(ctx context.Context, sessionID string) (*corev1.Pod, error) {
	sel := labels.SelectorFromSet(labels.Set{podspec.LabelManagedBy: b.opts.ManagedBy, podspec.LabelSession: sessionID}).String()
	list, err := b.client.CoreV1().Pods(b.opts.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list pods of session %s: %w", sessionID, err)
	}
	var best *corev1.Pod
	for i := range list.Items {
		p := &list.Items[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		if best == nil || p.CreationTimestamp.After(best.CreationTimestamp.Time) {
			best = p
		}
	}
	if best == nil {
		return nil, fmt.Errorf("session %s has no pod", sessionID)
	}
	return best, nil
}
