//go:build linux

package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
)

// DriverUser is the user name of [Env.Driver]'s token.
const DriverUser = "telorunner-driver"

// rbacFile is what a role file holds. Roles and ClusterRoles are bound to
// DriverUser; bindings in the file are applied as they are (RoleBindings in
// the test namespace).
type rbacFile struct {
	roles               []*rbacv1.Role
	clusterRoles        []*rbacv1.ClusterRole
	roleBindings        []*rbacv1.RoleBinding
	clusterRoleBindings []*rbacv1.ClusterRoleBinding
}

// loadRBAC parses a plain (untemplated) multi-document YAML file holding at
// least one Role.
func loadRBAC(path string) (*rbacFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open role file: %w", err)
	}
	defer f.Close()
	var rf rbacFile
	r := yaml.NewYAMLReader(bufio.NewReader(f))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		if js, err := yaml.ToJSON(doc); err == nil && bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue // empty document or only comments
		}
		obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("decode %s document %d: %w", path, i, err)
		}
		switch o := obj.(type) {
		case *rbacv1.Role:
			rf.roles = append(rf.roles, o)
		case *rbacv1.ClusterRole:
			rf.clusterRoles = append(rf.clusterRoles, o)
		case *rbacv1.RoleBinding:
			rf.roleBindings = append(rf.roleBindings, o)
		case *rbacv1.ClusterRoleBinding:
			rf.clusterRoleBindings = append(rf.clusterRoleBindings, o)
		default:
			return nil, fmt.Errorf("decode %s document %d: kind %s is not Role, ClusterRole, RoleBinding or ClusterRoleBinding", path, i, gvk.Kind)
		}
	}
	if len(rf.roles) == 0 {
		return nil, fmt.Errorf("read %s: no Role", path)
	}
	return &rf, nil
}

// apply creates the file's objects, binds its roles to DriverUser and
// returns once the API server's authorizer grants DriverUser the first rule
// of every role (RBAC caches bindings; a test must not race it).
func (rf *rbacFile) apply(ctx context.Context, admin, driver kubernetes.Interface, ns string) error {
	rbac := admin.RbacV1()
	user := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: DriverUser}
	for _, r := range rf.roles {
		r = r.DeepCopy()
		r.Namespace = ns
		if _, err := rbac.Roles(ns).Create(ctx, r, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create role %s: %w", r.Name, err)
		}
		b := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "kubetest-" + r.Name, Namespace: ns},
			Subjects:   []rbacv1.Subject{user},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: r.Name},
		}
		if _, err := rbac.RoleBindings(ns).Create(ctx, b, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create role binding %s: %w", b.Name, err)
		}
	}
	for _, r := range rf.clusterRoles {
		if _, err := rbac.ClusterRoles().Create(ctx, r.DeepCopy(), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create cluster role %s: %w", r.Name, err)
		}
		b := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "kubetest-" + r.Name},
			Subjects:   []rbacv1.Subject{user},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r.Name},
		}
		if _, err := rbac.ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create cluster role binding %s: %w", b.Name, err)
		}
	}
	for _, b := range rf.roleBindings {
		b = b.DeepCopy()
		b.Namespace = ns
		if _, err := rbac.RoleBindings(ns).Create(ctx, b, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create role binding %s: %w", b.Name, err)
		}
	}
	for _, b := range rf.clusterRoleBindings {
		if _, err := rbac.ClusterRoleBindings().Create(ctx, b.DeepCopy(), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create cluster role binding %s: %w", b.Name, err)
		}
	}

	var checks []authorizationv1.ResourceAttributes
	for _, r := range rf.roles {
		if a, ok := firstGrant(r.Rules, ns); ok {
			checks = append(checks, a)
		}
	}
	for _, r := range rf.clusterRoles {
		if a, ok := firstGrant(r.Rules, ns); ok {
			checks = append(checks, a)
		}
	}
	for _, a := range checks {
		err := poll(ctx, func() (bool, error) {
			rev, err := driver.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx,
				&authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &a}},
				metav1.CreateOptions{})
			if err != nil {
				return false, err
			}
			return rev.Status.Allowed, nil
		})
		if err != nil {
			return fmt.Errorf("wait for %s to be allowed to %s %s: %w", DriverUser, a.Verb, a.Resource, err)
		}
	}
	return nil
}

// firstGrant is the first concrete (resource, verb) pair a rule list grants.
func firstGrant(rules []rbacv1.PolicyRule, ns string) (authorizationv1.ResourceAttributes, bool) {
	for _, rule := range rules {
		if len(rule.APIGroups) == 0 || len(rule.Resources) == 0 || len(rule.Verbs) == 0 {
			continue
		}
		res, sub, _ := strings.Cut(rule.Resources[0], "/")
		if res == "*" || sub == "*" || rule.Verbs[0] == "*" || rule.APIGroups[0] == "*" {
			continue
		}
		return authorizationv1.ResourceAttributes{
			Namespace: ns, Verb: rule.Verbs[0], Group: rule.APIGroups[0],
			Resource: res, Subresource: sub,
		}, true
	}
	return authorizationv1.ResourceAttributes{}, false
}
