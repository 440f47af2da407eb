package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/imagebuild"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/podspec"
)

// Progress messages of the build phase (contract 7: the reference's).
const (
	msgCached   = "Using cached image"
	msgBuilding = "Building image…"
	msgWaiting  = "Waiting for in-progress build…"
	msgBuilt    = "Image built"
)

// buildLogLines is how much of the build pod's log a failure carries.
const buildLogLines = 20

// errBuildTimeout marks a build that did not finish in time.
var errBuildTimeout = errors.New("build timeout")

// runImage returns the built image ref of a run session (contract 11.11):
// the tag of its base image and dependency key, the registry checked
// first, one build per ref across drivers (BuildLocks), a build Job
// otherwise. Errors are start errors of stage create.
func (b *Backend) runImage(ctx context.Context, spec backend.Spec, app string, sink backend.Sink) (string, error) {
	o := b.opts
	entry, err := contract.NormalizePath(spec.Bundle.EntryRelativePath)
	if len(spec.Apps) == 1 {
		entry, err = contract.NormalizePath(spec.Apps[0].Entry)
	}
	if err != nil {
		return "", fmt.Errorf("entry: %w", err)
	}
	files := make([]imagebuild.File, 0, len(spec.Bundle.Files))
	for _, f := range spec.Bundle.Files {
		rel, err := contract.NormalizePath(f.RelativePath)
		if err != nil {
			return "", err
		}
		data, err := podspec.BundleFileBytes(f)
		if err != nil {
			return "", err
		}
		files = append(files, imagebuild.File{Path: rel, Contents: data})
	}
	keys := b.pushKeys(ctx)
	base := spec.Config.Image
	if base == "" {
		base = o.KernelImage
	}
	in := imagebuild.TagInput{BaseImage: base, TeloRegistryURL: spec.Env["TELO_REGISTRY_URL"], Files: files}
	if spec.Config.PullPolicy == "always" {
		digest, err := b.baseDigest(ctx, base, keys)
		if err != nil {
			sink.Progress(contract.PhaseBuild, fmt.Sprintf("Base image freshness check failed (%v); using cached image", err), false, app)
		}
		in.BaseDigest = digest
	}
	tag := imagebuild.Tag(in)
	reg := imagebuild.Registry{Repository: o.ImageRepository, APIURL: o.RegistryAPIURL, Insecure: o.RegistryInsecure}
	ref := reg.Ref(tag)
	if reg.Exists(ctx, tag, keys) {
		sink.Progress(contract.PhaseBuild, msgCached, true, app)
		return ref, nil
	}
	waiting := func() { sink.Progress(contract.PhaseBuild, msgWaiting, false, app) }
	if o.BuildLocks != nil {
		waited := false
		release, err := o.BuildLocks.Acquire(ctx, ref, func() { waited = true; waiting() })
		if err != nil {
			return "", fmt.Errorf("image build: %w", err)
		}
		defer release()
		// The holder we waited for has pushed it (or failed: build).
		if waited && reg.Exists(ctx, tag, keys) {
			sink.Progress(contract.PhaseBuild, msgCached, true, app)
			return ref, nil
		}
	}
	err = b.buildJob(ctx, podspec.BuildSpec{Tag: tag, Ref: ref, BaseImage: base, Entry: entry,
		TeloRegistryURL: spec.Env["TELO_REGISTRY_URL"], Files: spec.Bundle.Files}, app, sink, waiting)
	if err != nil {
		return "", err
	}
	sink.Progress(contract.PhaseBuild, msgBuilt, true, app)
	return ref, nil
}

// pushKeys is the push secret's keychain (RUNNER_REGISTRY_PUSH_SECRET in
// the build namespace): the existence check and base digests use it. A
// missing or unreadable secret is anonymous (logged).
func (b *Backend) pushKeys(ctx context.Context) authn.Keychain {
	if b.opts.PushSecret == "" {
		return nil
	}
	s, err := b.client.CoreV1().Secrets(b.opts.BuildNamespace).Get(ctx, b.opts.PushSecret, metav1.GetOptions{})
	if err != nil {
		b.log.Warn("read push secret", "secret", b.opts.PushSecret, "err", err)
		return nil
	}
	keys, err := imagebuild.ParseDockerConfig(s.Data[corev1.DockerConfigJsonKey])
	if err != nil {
		b.log.Warn("parse push secret", "secret", b.opts.PushSecret, "err", err)
		return nil
	}
	return keys
}

// baseDigest resolves the base image's digest (a manifest HEAD).
func (b *Backend) baseDigest(ctx context.Context, base string, keys authn.Keychain) (string, error) {
	var opts []name.Option
	if b.opts.RegistryInsecure {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.ParseReference(base, opts...)
	if err != nil {
		return "", err
	}
	if keys == nil {
		keys = authn.NewMultiKeychain()
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	d, err := remote.Head(ref, remote.WithContext(ctx), remote.WithAuthFromKeychain(keys))
	if err != nil {
		return "", err
	}
	return d.Digest.String(), nil
}

// buildJob runs the build Job of bs and waits for it: an existing Job of
// the same name is a peer's build (waited for), or a failed one left for
// its TTL (replaced).
func (b *Backend) buildJob(ctx context.Context, bs podspec.BuildSpec, app string, sink backend.Sink, waiting func()) error {
	o := b.opts
	job, cm, err := podspec.BuildJob(o.buildParams(), bs)
	if err != nil {
		return err
	}
	jobs := b.client.BatchV1().Jobs(o.BuildNamespace)
	deadline := time.Now().Add(o.BuildTimeout + 30*time.Second)
	if cur, err := jobs.Get(ctx, job.Name, metav1.GetOptions{}); err == nil {
		if done, failed := jobFinished(cur); !done || !failed {
			waiting()
			return b.waitJob(ctx, cur.Name, deadline)
		}
		// A failed build still within its TTL: try again.
		if err := b.deleteJob(ctx, cur.Name); err != nil {
			return fmt.Errorf("image build: replace failed job: %w", err)
		}
	}
	sink.Progress(contract.PhaseBuild, msgBuilding, false, app)
	cms := b.client.CoreV1().ConfigMaps(o.BuildNamespace)
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		if err = cms.Delete(ctx, cm.Name, metav1.DeleteOptions{}); err == nil || apierrors.IsNotFound(err) {
			_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
		}
		if err != nil {
			return fmt.Errorf("image build: create context configmap: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("image build: create context configmap: %w", err)
	}
	created, err := jobs.Create(ctx, job, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		waiting()
		return b.waitJob(ctx, job.Name, deadline)
	}
	if err != nil {
		_ = cms.Delete(context.WithoutCancel(ctx), cm.Name, metav1.DeleteOptions{})
		return fmt.Errorf("image build: create job: %w", err)
	}
	// The ConfigMap goes with the Job (ttlSecondsAfterFinished).
	if cur, err := cms.Get(ctx, cm.Name, metav1.GetOptions{}); err == nil {
		cur = cur.DeepCopy()
		cur.OwnerReferences = []metav1.OwnerReference{podspec.JobOwnerRef(created)}
		if _, err := cms.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			b.log.Warn("own build context configmap", "configmap", cm.Name, "err", err)
		}
	}
	return b.waitJob(ctx, created.Name, deadline)
}

// jobFinished reads a Job's terminal conditions.
func jobFinished(j *batchv1.Job) (done, failed bool) {
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			return true, false
		case batchv1.JobFailed, batchv1.JobFailureTarget:
			// FailureTarget: the controller has decided (e.g. the
			// deadline passed) and is terminating the pod.
			return true, true
		}
	}
	return false, false
}

// waitJob polls the Job every BuildPoll until it completes (nil), fails
// (the build pod's log tail) or the deadline passes.
func (b *Backend) waitJob(ctx context.Context, jobName string, deadline time.Time) error {
	secs := int64(b.opts.BuildTimeout / time.Second)
	t := time.NewTicker(b.opts.BuildPoll)
	defer t.Stop()
	for {
		j, err := b.client.BatchV1().Jobs(b.opts.BuildNamespace).Get(ctx, jobName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return errors.New("image build failed: build job disappeared")
		case err == nil:
			if done, failed := jobFinished(j); done {
				if !failed {
					return nil
				}
				for _, c := range j.Status.Conditions {
					if (c.Type == batchv1.JobFailed || c.Type == batchv1.JobFailureTarget) && c.Status == corev1.ConditionTrue && c.Reason == batchv1.JobReasonDeadlineExceeded {
						return fmt.Errorf("image build did not finish within %ds", secs)
					}
				}
				return fmt.Errorf("image build failed: %s", b.buildLogTail(ctx, jobName))
			}
		default:
			b.log.Warn("poll build job", "job", jobName, "err", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("image build did not finish within %ds", secs)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("image build: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// buildLogTail is the last buildLogLines log lines of the failed
// container of the Job's newest pod, or its termination reason when the
// log cannot be read.
func (b *Backend) buildLogTail(ctx context.Context, jobName string) string {
	pods := b.client.CoreV1().Pods(b.opts.BuildNamespace)
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{batchv1.JobNameLabel: jobName}).String()})
	if err != nil || len(list.Items) == 0 {
		return "no build pod"
	}
	sort.Slice(list.Items, func(i, j int) bool {
		return list.Items[i].CreationTimestamp.After(list.Items[j].CreationTimestamp.Time)
	})
	pod := list.Items[0]
	statuses := append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...)
	container, why := "", pod.Status.Message
	for _, s := range statuses {
		if t := s.State.Terminated; t != nil && t.ExitCode != 0 {
			container = s.Name
			why = fmt.Sprintf("container %s exited %d (%s) %s", s.Name, t.ExitCode, t.Reason, t.Message)
			break
		}
	}
	if container != "" {
		tail := int64(buildLogLines)
		raw, err := pods.GetLogs(pod.Name, &corev1.PodLogOptions{Container: container, TailLines: &tail}).DoRaw(ctx)
		if err == nil && len(strings.TrimSpace(string(raw))) > 0 {
			return strings.TrimRight(string(raw), "\n")
		}
	}
	if strings.TrimSpace(why) == "" {
		why = "pod " + pod.Name + " " + string(pod.Status.Phase)
	}
	return strings.TrimSpace(why)
}

// deleteJob deletes a Job and its pods and waits until it is gone.
func (b *Backend) deleteJob(ctx context.Context, jobName string) error {
	jobs := b.client.BatchV1().Jobs(b.opts.BuildNamespace)
	bg := metav1.DeletePropagationBackground
	if err := jobs.Delete(ctx, jobName, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	for range 60 {
		if _, err := jobs.Get(ctx, jobName, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return fmt.Errorf("job %s still exists", jobName)
}
