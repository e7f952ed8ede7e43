package api_test

import (
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/warrenhq/warren/api"
)

type openAPI struct {
	Paths      map[string]map[string]any `yaml:"paths"`
	Components struct {
		Schemas map[string]schema `yaml:"schemas"`
	} `yaml:"components"`
}

type schema struct {
	Properties map[string]any `yaml:"properties"`
}

func loadOpenAPI(t *testing.T) (openAPI, any) {
	t.Helper()
	b, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPI
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	var raw any
	if err := yaml.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	return doc, raw
}

// TestOpenAPIRefsResolve checks that every $ref names a component that
// exists.
func TestOpenAPIRefsResolve(t *testing.T) {
	_, raw := loadOpenAPI(t)
	root := raw.(map[string]any)
	var walk func(v any, at string)
	walk = func(v any, at string) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if k == "$ref" {
					ref, _ := x.(string)
					if !resolves(root, ref) {
						t.Errorf("%s: $ref %q names nothing", at, ref)
					}
					continue
				}
				walk(x, at+"/"+k)
			}
		case []any:
			for _, x := range v {
				walk(x, at)
			}
		}
	}
	walk(root, "")
}

func resolves(root map[string]any, ref string) bool {
	p, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return false
	}
	var v any = root
	for _, seg := range strings.Split(p, "/") {
		m, ok := v.(map[string]any)
		if !ok {
			return false
		}
		if v, ok = m[seg]; !ok {
			return false
		}
	}
	return true
}

// TestOpenAPIMatchesTypes checks that the schemas of these wire types list
// exactly their JSON fields.
func TestOpenAPIMatchesTypes(t *testing.T) {
	doc, _ := loadOpenAPI(t)
	for name, v := range map[string]any{
		"Node":                 api.Node{},
		"CreateSandboxRequest": api.CreateSandboxRequest{},
		"ExecRequest":          api.ExecRequest{},
		"FnRunRequest":         api.FnRunRequest{},
		"FnFile":               api.FnFile{},
		"FnCase":               api.FnCase{},
		"FnLimits":             api.FnLimits{},
		"FnCaseResult":         api.FnCaseResult{},
		"FnResult":             api.FnResult{},
		"FnBatchRequest":       api.FnBatchRequest{},
		"FnBatchResult":        api.FnBatchResult{},
		"FnBatchItem":          api.FnBatchItem{},
		"FnRuntime":            api.FnRuntime{},
		"FnRuntimeList":        api.FnRuntimeList{},
		"SandboxStats":         api.SandboxStats{},
		"SnapshotRequest":      api.SnapshotRequest{},
		"Snapshot":             api.Snapshot{},
		"SnapshotStats":        api.SnapshotStats{},
		"SnapshotList":         api.SnapshotList{},
		"ForkRequest":          api.ForkRequest{},
		"PublishRequest":       api.PublishRequest{},
		"EnvCheck":             api.EnvCheck{},
		"ExecEvent":            api.ExecEvent{},
	} {
		s, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("no schema %s", name)
			continue
		}
		var documented []string
		for p := range s.Properties {
			documented = append(documented, p)
		}
		sort.Strings(documented)
		if want := jsonFields(reflect.TypeOf(v)); !slices.Equal(documented, want) {
			t.Errorf("schema %s has properties %v; the Go type has %v", name, documented, want)
		}
	}
	for _, p := range []string{"/v1/fn/run", "/v1/fn/batch", "/v1/fn/runtimes", "/v1/sandboxes/{id}/stats",
		"/v1/sandboxes/{id}/snapshot", "/v1/sandboxes/{id}/fork", "/v1/snapshots", "/v1/snapshots/{ref}",
		"/v1/sandboxes/{id}/ports/{port}/{path}", "/v1/sandboxes/{id}/portforward/{port}"} {
		if _, ok := doc.Paths[p]; !ok {
			t.Errorf("path %s is not documented", p)
		}
	}
}

func jsonFields(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// TestOpenAPIErrorCodes checks that the error enum lists the FnCall codes.
func TestOpenAPIErrorCodes(t *testing.T) {
	b, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, code := range []string{api.CodeRuntimeNotFound, api.CodeRuntimeUnavailable, api.CodeFnOverloaded,
		api.CodeTooLarge, api.CodeNoCapacity, api.CodeNoMatchingNode, api.CodePortUnreachable,
		api.CodeSnapshotNotFound, api.CodeSnapshotTooSparse} {
		if !strings.Contains(string(b), code) {
			t.Errorf("openapi.yaml does not list error code %s", code)
		}
	}
}
