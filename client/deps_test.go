package client_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/warrenhq/warren"

// allowed reports whether the SDK may import p: the standard library, api/,
// and the SDK's own packages.
func allowed(p string) bool {
	first, _, _ := strings.Cut(p, "/")
	if !strings.Contains(first, ".") {
		return true // standard library
	}
	return p == module+"/api" || p == module+"/client" || strings.HasPrefix(p, module+"/client/")
}

// TestImportsStdlibAndAPIOnly parses every non-test file of client/... and
// api/ so the rule holds even without a go toolchain at hand.
func TestImportsStdlibAndAPIOnly(t *testing.T) {
	for _, dir := range []string{".", "../api"} {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), "_")) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			for _, imp := range f.Imports {
				ip, _ := strconv.Unquote(imp.Path.Value)
				if !allowed(ip) {
					t.Errorf("%s imports %s; client/ may use only api/ and the standard library", p, ip)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestDepsStdlibAndAPIOnly asks the go tool for the full transitive closure.
func TestDepsStdlibAndAPIOnly(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not in PATH; TestImportsStdlibAndAPIOnly still checks direct imports")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", module+"/client/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if !allowed(p) {
			t.Errorf("client/... depends on %s; it may use only api/ and the standard library", p)
		}
	}
}
