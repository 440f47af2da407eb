package kubernetes_test

import (
	"archive/tar"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kernelwire"
	kube "github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/imagebuild"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/podspec"
	"github.com/telorunner/telorunner/tools/kubetest"
)

const (
	buildNS      = "telo-builds"
	builderImage = "telorunner/telo-layer:test"
	regUser      = "pusher"
	regPass      = "s3cret"
)

// buildBed is a cluster with the build path on: an in-process OCI
// registry behind Basic auth holding the base image, the build namespace
// with deploy/kubernetes/build-role.yaml, the push secret, and two
// backends (two drivers) sharing one NATS for their build locks.
type buildBed struct {
	env      *kubetest.Env
	admin    k8s.Interface
	host     string // registry host:port
	base     v1.Image
	baseRef  string
	repo     string
	keys     *imagebuild.DockerConfig
	backends []*kube.Backend
}

func newBuildBed(t *testing.T) *buildBed {
	t.Helper()
	return newBuildBedWith(t, 60*time.Second)
}

func newBuildBedWith(t *testing.T, timeout time.Duration) *buildBed {
	t.Helper()
	reg := registry.New()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != regUser || p != regPass {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	bb := &buildBed{host: strings.TrimPrefix(srv.URL, "http://")}
	bb.baseRef = bb.host + "/telorun/node:test"
	bb.repo = bb.host + "/telo/apps"
	dockerConfig := fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, bb.host, base64.StdEncoding.EncodeToString([]byte(regUser+":"+regPass)))
	var err error
	if bb.keys, err = imagebuild.ParseDockerConfig(dockerConfig); err != nil {
		t.Fatal(err)
	}
	if bb.base, err = random.Image(256, 2); err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(bb.baseRef, name.Insecure)
	if err := remote.Write(ref, bb.base, remote.WithAuthFromKeychain(bb.keys)); err != nil {
		t.Fatal(err)
	}

	bb.env = kubetest.Start(t, kubetest.Options{})
	bb.env.AddNamespace(t, buildNS, filepath.Join("..", "..", "..", "..", "..", "deploy", "kubernetes", "build-role.yaml"))
	bb.env.StartKubelet(t, kubetest.KubeletOptions{
		// The base image and every built image run the devkernel (named
		// telo); the build Job's push container runs telo-layer.
		Images: map[string]string{bb.host + "/telorun/node": bins.devkernel, bb.repo: bins.devkernel, builderImage: bins.layer, workspaceImage: bins.workspace},
		Args:   []string{"--root", t.TempDir(), "--log-level", "debug"},
	})
	if bb.admin, err = k8s.NewForConfig(bb.env.Admin); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "push", Namespace: buildNS},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: dockerConfig},
	}
	if _, err := bb.admin.CoreV1().Secrets(buildNS).Create(context.Background(), secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	s := testkit.StartJetStream(t)
	testkit.Provision(t, s, bus.Limits{})
	for _, id := range []string{"driver-a", "driver-b"} {
		_, js := testkit.Connect(t, s, bus.RoleDriver)
		locks, err := imagebuild.OpenLocks(context.Background(), js, id, nil)
		if err != nil {
			t.Fatal(err)
		}
		locks.Poll = 200 * time.Millisecond
		b, err := kube.New(kube.Options{
			RestConfig: bb.env.Driver, Namespace: bb.env.Namespace,
			KernelImage: bb.baseRef, WorkspaceImage: workspaceImage,
			RunLimits:     kube.Limits{CPU: "50m", Memory: "100Mi", EphemeralStorage: "512Mi", TTLSeconds: 3600},
			AppLimits:     kube.Limits{CPU: "500m", Memory: "512Mi", EphemeralStorage: "1Gi", TTLSeconds: 21600},
			StartDeadline: 20 * time.Second,
			Reach:         kernelwire.ReachTiming{Interval: 100 * time.Millisecond, Deadline: 5 * time.Second, SlowInterval: time.Second},
			RelayRetry:    100 * time.Millisecond,

			ImageRepository: bb.repo, BuildNamespace: buildNS, BuilderImage: builderImage,
			BuildTimeout: timeout, RegistryInsecure: true, RegistryAPIURL: srv.URL,
			PushSecret: "push", BuildLocks: locks, BuildPoll: 200 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := b.Close(ctx); err != nil {
				t.Errorf("Close() = %v", err)
			}
		})
		bb.backends = append(bb.backends, b)
	}
	return bb
}

func buildSpec(entry string) backend.Spec {
	return backend.Spec{
		SessionID: contract.NewSessionID(), Mode: contract.ModeRun,
		Env: map[string]string{"TELO_REGISTRY_URL": "https://registry.telo.run"},
		Bundle: contract.Bundle{EntryRelativePath: "telo.yaml", Files: []contract.BundleFile{
			{RelativePath: "telo.yaml", Contents: entry},
			{RelativePath: "lib/extra.yaml", Contents: "kind: Telo.Library\nimports:\n  kv: pkg:npm/@telorun/kv@0.3.0\n"},
		}},
		Apps: []backend.App{{Name: "app", Entry: "telo.yaml", IO: contract.IOStreams}},
	}
}

func (bb *buildBed) jobs(t *testing.T) []batchv1.Job {
	t.Helper()
	l, err := bb.admin.BatchV1().Jobs(buildNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func (r *recorder) progressLines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.progress)
}

// Two drivers start sessions of the same app at the same moment: exactly
// one build Job runs, the pushed image is the base image plus one layer
// holding /app and the installed cache, both sessions run on it; a third
// session finds it in the registry (no second Job).
func TestRunImageBuild(t *testing.T) {
	bb := newBuildBed(t)
	// The probe reviews the build namespace's Role too: bound, no issue.
	if issues, err := bb.backends[0].Probe(context.Background()); err != nil || len(issues) != 0 {
		t.Fatalf("Probe() = %v, %v; want ready", issues, err)
	}
	entry := manifest("built", 0, "imports:\n  http: pkg:npm/@telorun/http-server@1.2.0\nx-devkernel:\n  exitAfterMs: 300\n")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var wg sync.WaitGroup
	recs := []*recorder{newRecorder(), newRecorder()}
	ws := make([]backend.Workload, 2)
	specs := []backend.Spec{buildSpec(entry), buildSpec(entry)}
	errs := make([]error, 2)
	start := time.Now()
	for i, b := range bb.backends {
		wg.Go(func() { ws[i], errs[i] = b.Start(ctx, specs[i], recs[i]) })
	}
	wg.Wait()
	t.Logf("two concurrent starts with one build: %v", time.Since(start).Round(time.Millisecond))
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Start() on driver %d = %v (progress %v)", i, err, recs[i].progressLines())
		}
	}
	jobs := bb.jobs(t)
	if len(jobs) != 1 {
		t.Fatalf("%d build jobs, want exactly 1", len(jobs))
	}
	job := jobs[0]
	tag := strings.TrimPrefix(job.Name, "telo-build-")
	if len(tag) != 32 || job.Labels[podspec.LabelBuild] != "true" {
		t.Fatalf("job %s labels %v", job.Name, job.Labels)
	}
	ref := bb.repo + ":" + tag
	built, waited := 0, 0
	for i, r := range recs {
		p := r.progressLines()
		switch {
		case slices.Contains(p, "build: Building image…") && slices.Contains(p, "build: Image built"):
			built++
		case slices.Contains(p, "build: Waiting for in-progress build…"):
			// The lock (not the Job name's 409) made it wait: once the
			// holder released it, the registry had the image.
			if !slices.Contains(p, "build: Using cached image") {
				t.Errorf("driver %d waited but did not find the image in the registry: %v", i, p)
			}
			waited++
		default:
			t.Errorf("driver %d progress %v: neither built nor waited", i, p)
		}
		pod, err := bb.admin.CoreV1().Pods(bb.env.Namespace).Get(ctx, podspec.RunPodName(specs[i].SessionID), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := pod.Spec.Containers[0]
		if c.Image != ref || c.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("run pod %d image %s %s, want %s IfNotPresent", i, c.Image, c.ImagePullPolicy, ref)
		}
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "TELO_CACHE_DIR" && e.Value == "/telo-cache" }) {
			t.Errorf("run pod %d env %v: no TELO_CACHE_DIR=/telo-cache", i, c.Env)
		}
	}
	if built != 1 || waited != 1 {
		t.Errorf("%d drivers built and %d waited, want 1 and 1", built, waited)
	}
	// Both sessions ran on the built image to their exit.
	for i, w := range ws {
		select {
		case <-w.Done():
		case <-ctx.Done():
			t.Fatalf("session %d did not end", i)
		}
		if ex := w.Exit(); ex.Code == nil || *ex.Code != 0 {
			t.Errorf("session %d exit %+v, want code 0", i, ex)
		}
	}

	// The pushed image: the base's layers, then one with /app and the
	// cache telo install wrote.
	dref, _ := name.ParseReference(ref, name.Insecure)
	img, err := remote.Image(dref, remote.WithAuthFromKeychain(bb.keys))
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	ls, _ := img.Layers()
	bl, _ := bb.base.Layers()
	if len(ls) != len(bl)+1 {
		t.Fatalf("built image has %d layers, want the base's %d + 1", len(ls), len(bl))
	}
	files := layerFiles(t, ls[len(ls)-1])
	if files["app/telo.yaml"] != entry || files["app/lib/extra.yaml"] == "" {
		t.Errorf("top layer /app: %v", keysOf(files))
	}
	if got := files["telo-cache/devkernel/installed.txt"]; !strings.HasPrefix(got, "installed telo.yaml sha256:") {
		t.Errorf("top layer cache: %q (files %v)", got, keysOf(files))
	}

	// Same dependencies, another bundle body: the registry has it.
	rec := newRecorder()
	spec := buildSpec(entry + "# another comment\n")
	start = time.Now()
	w, err := bb.backends[0].Start(ctx, spec, rec)
	t.Logf("start on the cached image: %v", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("third Start() = %v", err)
	}
	<-w.Done()
	if p := rec.progressLines(); !slices.Contains(p, "build: Using cached image") || slices.Contains(p, "build: Building image…") {
		t.Errorf("third session progress %v, want Using cached image and no build", p)
	}
	jobs = bb.jobs(t)
	if len(jobs) != 1 || jobs[0].UID != job.UID {
		t.Errorf("after the cached start: %d jobs, want the first one only", len(jobs))
	}
	// pullPolicy always: the base image's digest joins the tag, so the
	// same app is another image (19.11: resolved on the base's own
	// registry).
	rec = newRecorder()
	spec = buildSpec(entry)
	spec.Config.PullPolicy = "always"
	w, err = bb.backends[1].Start(ctx, spec, rec)
	if err != nil {
		t.Fatalf("pullPolicy always Start() = %v", err)
	}
	<-w.Done()
	if p := rec.progressLines(); !slices.Contains(p, "build: Building image…") || slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, "freshness check failed") }) {
		t.Errorf("pullPolicy always progress %v, want a build of a digest-keyed tag", p)
	}
	if n := len(bb.jobs(t)); n != 2 {
		t.Errorf("%d jobs after the pullPolicy always start, want 2", n)
	}
	// The build context ConfigMap belongs to the Job (it goes with it).
	cm, err := bb.admin.CoreV1().ConfigMaps(buildNS).Get(ctx, job.Name, metav1.GetOptions{})
	if err != nil || len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].UID != job.UID {
		t.Errorf("context configmap %v, %v: want owned by the job", cm.OwnerReferences, err)
	}
}

// A failing install fails the start at stage create with the build's
// failure, and leaves no run pod.
func TestRunImageBuildFailure(t *testing.T) {
	bb := newBuildBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := buildSpec(manifest("broken", 0, "imports:\n  x: pkg:npm/x@1.0.0\n# devkernel-install: fail\n"))
	_, err := bb.backends[0].Start(ctx, spec, newRecorder())
	se, ok := err.(*backend.StartError)
	if !ok || se.Stage != "create" || !strings.HasPrefix(se.Message, "image build failed: ") {
		t.Fatalf("Start() = %v, want a create-stage start error 'image build failed: …'", err)
	}
	t.Logf("start error: %s", se.Message)
	// The last 20 lines of the failed container's log (pods/log through
	// the API server): devkernel's install printed 25.
	var want []string
	for i := 6; i <= 25; i++ {
		want = append(want, fmt.Sprintf("install error line %d", i))
	}
	if got := strings.TrimPrefix(se.Message, "image build failed: "); got != strings.Join(want, "\n") {
		t.Errorf("failure tail %q, want the install log's last 20 lines", got)
	}
	if _, err := bb.admin.CoreV1().Pods(bb.env.Namespace).Get(ctx, podspec.RunPodName(spec.SessionID), metav1.GetOptions{}); err == nil {
		t.Error("a run pod was created after a failed build")
	}
}

func layerFiles(t *testing.T, l v1.Layer) map[string]string {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			out[h.Name] = string(b)
		}
	}
}

func keysOf(m map[string]string) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	slices.Sort(k)
	return k
}

// A build that outlives RUNNER_BUILD_TIMEOUT_SECONDS: the Job's
// activeDeadlineSeconds ends it and the start fails with the timeout.
func TestRunImageBuildTimeout(t *testing.T) {
	bb := newBuildBedWith(t, 3*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := buildSpec(manifest("slow", 0, "imports:\n  x: pkg:npm/slow@1.0.0\n# devkernel-install: hang\n"))
	start := time.Now()
	_, err := bb.backends[0].Start(ctx, spec, newRecorder())
	se, ok := err.(*backend.StartError)
	if !ok || se.Stage != "create" || se.Message != "image build did not finish within 3s" {
		t.Fatalf("Start() = %v, want the create-stage 'image build did not finish within 3s'", err)
	}
	took := time.Since(start)
	t.Logf("timed out after %v", took.Round(time.Millisecond))
	if took > 20*time.Second {
		t.Errorf("the timeout took %v: the Job's deadline was not seen (only the driver's own timeout + 30 s)", took)
	}
	jobs := bb.jobs(t)
	if len(jobs) != 1 || *jobs[0].Spec.ActiveDeadlineSeconds != 3 {
		t.Fatalf("jobs %d, want one with activeDeadlineSeconds 3", len(jobs))
	}
}
