package kubernetes

import (
	"context"
	"fmt"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/telorunner/telorunner/pkg/contract"
)

// Rules are the rules of the driver's Role in the session namespace,
// exactly deploy/kubernetes/role.yaml (TestRulesMatchRoleFile).
var Rules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"pods", "services"}, Verbs: []string{"get", "list", "watch", "create", "delete", "update"}},
	{APIGroups: []string{""}, Resources: []string{"pods/log", "pods/attach"}, Verbs: []string{"get", "create"}},
	{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"ingresses"}, Verbs: []string{"get", "list", "watch", "create", "delete", "update"}},
	{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update", "list", "delete"}},
}

// BuildRules are the rules of the driver's Role in the build namespace,
// exactly deploy/kubernetes/build-role.yaml (TestBuildRulesMatchRoleFile);
// Probe reviews them when run images are built (ImageRepository set).
var BuildRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"get", "create", "delete"}},
	{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update", "delete"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
	{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
	{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}},
}

// Probe checks what the driver needs to start sessions (POST /v1/probe on
// Kubernetes): the session namespace exists, and a SelfSubjectAccessReview
// per verb of Rules says the driver holds it there. It returns one issue
// per missing piece (the namespace; each resource with the verbs it
// lacks), none when ready; with the build path on, the same for
// BuildRules in the build namespace (paths /kubernetes/build-role/<res>).
// An error means the API server did not answer.
func (b *Backend) Probe(ctx context.Context) ([]contract.Issue, error) {
	ns := b.opts.Namespace
	var issues []contract.Issue
	_, err := b.client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		issues = append(issues, contract.Issue{Path: "/kubernetes/namespace",
			Message: fmt.Sprintf("the session namespace %q does not exist: install the chart or create it (RUNNER_SESSION_NAMESPACE)", ns)})
	case err != nil && !apierrors.IsForbidden(err):
		// Forbidden: the driver may not read namespaces (a cluster-wide
		// right it does not need); the access reviews below still tell.
		return nil, fmt.Errorf("read namespace %s: %w", ns, err)
	}
	forbidden := apierrors.IsForbidden(err)
	roleIssues, denied, err := b.review(ctx, ns, Rules, "/kubernetes/role/", "deploy/kubernetes/role.yaml")
	if err != nil {
		return nil, err
	}
	issues = append(issues, roleIssues...)
	if forbidden && denied == len(resources()) {
		// Nothing is granted there: a Role cannot be bound in a namespace
		// that does not exist, so say that it may be missing.
		issues = append([]contract.Issue{{Path: "/kubernetes/namespace",
			Message: fmt.Sprintf("the session namespace %q may not exist (the driver may not read namespaces to tell), and the driver holds none of its Role there", ns)}}, issues...)
	}
	if b.opts.ImageRepository != "" {
		buildIssues, _, err := b.review(ctx, b.opts.BuildNamespace, BuildRules, "/kubernetes/build-role/", "deploy/kubernetes/build-role.yaml")
		if err != nil {
			return nil, err
		}
		issues = append(issues, buildIssues...)
	}
	return issues, nil
}

// review asks one SelfSubjectAccessReview per verb of rules in ns and
// returns an issue per resource with the verbs it lacks, and how many
// resources lack any.
func (b *Backend) review(ctx context.Context, ns string, rules []rbacv1.PolicyRule, pathPrefix, file string) (issues []contract.Issue, denied int, err error) {
	for _, r := range rules {
		for _, res := range r.Resources {
			resource, sub, _ := strings.Cut(res, "/")
			var missing []string
			for _, verb := range r.Verbs {
				review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
					ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: r.APIGroups[0], Resource: resource, Subresource: sub},
				}}
				got, err := b.client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
				if err != nil {
					return nil, 0, fmt.Errorf("access review %s %s: %w", verb, res, err)
				}
				if !got.Status.Allowed {
					missing = append(missing, verb)
				}
			}
			if len(missing) > 0 {
				denied++
				group := r.APIGroups[0]
				if group == "" {
					group = "core"
				}
				issues = append(issues, contract.Issue{Path: pathPrefix + res,
					Message: fmt.Sprintf("the driver may not %s %s (%s) in namespace %q: bind %s to its ServiceAccount there", strings.Join(missing, ", "), res, group, ns, file)})
			}
		}
	}
	return issues, denied, nil
}

// resources lists every resource of Rules.
func resources() []string {
	var out []string
	for _, r := range Rules {
		out = append(out, r.Resources...)
	}
	return out
}
