package identity

import (
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/testutil"
)

func pod(psc *v1.PodSecurityContext, csc *v1.SecurityContext) (*v1.Pod, *v1.Container) {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u-1"},
		Spec:       v1.PodSpec{SecurityContext: psc, Containers: []v1.Container{{Name: "c", SecurityContext: csc}}},
	}
	return p, &p.Spec.Containers[0]
}

func TestResolve(t *testing.T) {
	for name, tc := range map[string]struct {
		psc  *v1.PodSecurityContext
		csc  *v1.SecurityContext
		want Identity
	}{
		"nothing set: root": {want: Identity{}},
		"pod level": {
			psc:  &v1.PodSecurityContext{RunAsUser: testutil.Ptr[int64](1000), RunAsGroup: testutil.Ptr[int64](1000), FSGroup: testutil.Ptr[int64](2000)},
			want: Identity{UID: 1000, GID: 1000, Groups: []uint32{2000}},
		},
		"container overrides pod": {
			psc:  &v1.PodSecurityContext{RunAsUser: testutil.Ptr[int64](1000), RunAsGroup: testutil.Ptr[int64](1000)},
			csc:  &v1.SecurityContext{RunAsUser: testutil.Ptr[int64](1001), RunAsGroup: testutil.Ptr[int64](1002)},
			want: Identity{UID: 1001, GID: 1002},
		},
		"container user, pod group": {
			psc:  &v1.PodSecurityContext{RunAsGroup: testutil.Ptr[int64](1000)},
			csc:  &v1.SecurityContext{RunAsUser: testutil.Ptr[int64](1001)},
			want: Identity{UID: 1001, GID: 1000},
		},
		"user without group: gid 0": {
			psc:  &v1.PodSecurityContext{RunAsUser: testutil.Ptr[int64](1000)},
			want: Identity{UID: 1000},
		},
		"fsGroup first, then supplementalGroups, once each": {
			psc:  &v1.PodSecurityContext{FSGroup: testutil.Ptr[int64](2000), SupplementalGroups: []int64{3000, 2000, 4000}},
			want: Identity{Groups: []uint32{2000, 3000, 4000}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			p, c := pod(tc.psc, tc.csc)
			if got := Resolve(p, c); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Resolve() = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestVerifyRunAsNonRoot(t *testing.T) {
	for name, tc := range map[string]struct {
		psc     *v1.PodSecurityContext
		csc     *v1.SecurityContext
		wantErr string
	}{
		"not asked":      {psc: &v1.PodSecurityContext{RunAsUser: testutil.Ptr[int64](0)}},
		"pod, no user":   {psc: &v1.PodSecurityContext{RunAsNonRoot: testutil.Ptr(true)}, wantErr: `container has runAsNonRoot and image will run as root (pod: "p_ns(u-1)", container: c)`},
		"pod, user 1000": {psc: &v1.PodSecurityContext{RunAsNonRoot: testutil.Ptr(true), RunAsUser: testutil.Ptr[int64](1000)}},
		"container user 0 under a non-root pod": {
			psc:     &v1.PodSecurityContext{RunAsNonRoot: testutil.Ptr(true), RunAsUser: testutil.Ptr[int64](1000)},
			csc:     &v1.SecurityContext{RunAsUser: testutil.Ptr[int64](0)},
			wantErr: `container's runAsUser breaks non-root policy (pod: "p_ns(u-1)", container: c)`,
		},
		"container asks, pod user 1000": {
			psc: &v1.PodSecurityContext{RunAsUser: testutil.Ptr[int64](1000)},
			csc: &v1.SecurityContext{RunAsNonRoot: testutil.Ptr(true)},
		},
		"container asks, no user": {
			csc:     &v1.SecurityContext{RunAsNonRoot: testutil.Ptr(true)},
			wantErr: "image will run as root",
		},
		"container lifts the pod's demand": {
			psc: &v1.PodSecurityContext{RunAsNonRoot: testutil.Ptr(true)},
			csc: &v1.SecurityContext{RunAsNonRoot: testutil.Ptr(false)},
		},
	} {
		t.Run(name, func(t *testing.T) {
			p, c := pod(tc.psc, tc.csc)
			err := VerifyRunAsNonRoot(p, c)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("VerifyRunAsNonRoot() = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("VerifyRunAsNonRoot() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestHome(t *testing.T) {
	if got := (Identity{}).Home(); got != "/root" {
		t.Errorf("root's HOME = %q, want /root", got)
	}
	if got := (Identity{UID: 1000, GID: 1000}).Home(); got != "/" {
		t.Errorf("uid 1000's HOME = %q, want /", got)
	}
}
