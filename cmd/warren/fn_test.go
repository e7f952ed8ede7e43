package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/fncall/fncalltest"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/node/nodetest"
)

// fnServer serves the real API on one fake-backend node whose FnCall
// runner is a fake declaring python3, cpp and sh; it returns a function
// running the CLI against it with stdin.
func fnServer(t *testing.T) (func(stdin string, args ...string) result, *fncalltest.Fake) {
	t.Helper()
	fake := fncalltest.New("python3", "cpp", "sh")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Node: nodetest.New(t, nil), Fn: fake, Images: imagetest.Busybox, Tokens: apiserver.StaticToken("tok"), Log: log,
	}))
	t.Cleanup(srv.Close)
	return func(stdin string, args ...string) result {
		vars := map[string]string{"WARREN_ADDR": srv.URL, "WARREN_TOKEN": "tok"}
		var out, errOut bytes.Buffer
		a := &app{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, getenv: func(k string) string { return vars[k] }}
		code := run(context.Background(), args, a)
		return result{code, out.String(), errOut.String()}
	}, fake
}

func TestFnRunSingle(t *testing.T) {
	cli, fake := fnServer(t)
	dir := writeFiles(t, map[string]string{"sol.py": "print(input())", "in.txt": "hello\n", "data.csv": "a,b\n"})
	p := func(name string) string { return filepath.Join(dir, name) }

	r := cli("", "fn", "run", "--runtime", "python3", p("sol.py"), "--stdin", p("in.txt"),
		"--cpu-time", "2s", "--wall-time", "5s", "--memory", "256Mi", "--pids", "16", "--output-limit", "1Mi", "--file-size", "4Mi",
		"--file", p("data.csv"), "--file", p("data.csv")+":lib/d.csv", "-e", "K=V", "--arg", "x", "--", "y", "--z")
	// The program's stdout is warren's; the summary ends stderr.
	if r.code != 0 || r.stdout != "hello\nx y --z" || !strings.Contains(r.stderr, "warren: OK  cpu 1ms  wall 2ms  mem 1.0MiB") {
		t.Errorf("single run: exit %d\nstdout %q\nstderr %q", r.code, r.stdout, r.stderr)
	}
	got := fake.Calls()[0]
	want := api.FnLimits{CPUTime: api.Duration(2 * time.Second), WallTime: api.Duration(5 * time.Second), Memory: 256 << 20,
		PIDs: 16, Output: 1 << 20, FileSize: 4 << 20}
	if got.Runtime != "python3" || got.Source != "print(input())" || got.Stdin != "hello\n" || got.Limits != want ||
		len(got.Files) != 2 || got.Files[0].Path != "data.csv" || got.Files[1].Path != "lib/d.csv" || got.Files[1].Content != "a,b\n" ||
		strings.Join(got.Args, " ") != "x y --z" || got.Env["K"] != "V" || len(got.Cases) != 0 {
		t.Errorf("the runner got %+v", got)
	}

	// Source from stdin; a failing program exits 1 and says how.
	r = cli("EXIT 3", "fn", "run", "--runtime", "python3", "-")
	if r.code != 1 || !strings.Contains(r.stderr, "warren: NonZeroExit") || !strings.Contains(r.stderr, "exit 3") {
		t.Errorf("exit 3: exit %d, stderr %q", r.code, r.stderr)
	}
	r = cli("", "fn", "run", "--runtime", "cpp", p("sol.py"), "--stdin", "-")
	if r.code != 0 {
		t.Errorf("cpp: exit %d %q", r.code, r.stderr)
	}
	r = cli("COMPILE_ERROR", "fn", "run", "--runtime", "cpp", "-")
	if r.code != 1 || !strings.Contains(r.stderr, "error: expected ';'") || !strings.Contains(r.stderr, "warren: CompileError") {
		t.Errorf("compile error: exit %d, stderr %q", r.code, r.stderr)
	}
	// A platform fault is not the program's: exit 3.
	r = cli("SANDBOX_ERROR", "fn", "run", "--runtime", "sh", "-")
	if r.code != 3 || !strings.Contains(r.stderr, "SandboxError") {
		t.Errorf("sandbox error: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestFnRunCases(t *testing.T) {
	cli, fake := fnServer(t)
	dir := writeFiles(t, map[string]string{"main.cpp": "int main(){}",
		"in1": "1 2\n", "out1": "1 2  \n\n", "in2": "3\n4\n", "out2": "3\n5\n", "in3": "x"})
	p := func(name string) string { return filepath.Join(dir, name) }

	r := cli("", "fn", "run", "--runtime", "cpp", p("main.cpp"), "--case", p("in1")+":"+p("out1"),
		"--case", p("in2")+":"+p("out2"), "--case", p("in3"), "--stop-on-fail")
	if r.code != 1 {
		t.Errorf("exit %d, want 1; stderr %q", r.code, r.stderr)
	}
	for _, want := range []string{"CASE", "STATUS", "MEMORY", "compile", "\n1 ", "OK", "\n2 ", "WrongAnswer", "\n3 ", "Skipped",
		"case 2: wrong answer at line 2:\n  expected: \"5\"\n  got:      \"4\"", "WrongAnswer: 1/3 cases OK (node n1"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, r.stdout)
		}
	}
	got := fake.Calls()[0]
	if len(got.Cases) != 3 || got.Cases[0].Stdin != "1 2\n" || *got.Cases[1].Expected != "3\n5\n" || got.Cases[2].Expected != nil || !got.StopOnFail {
		t.Errorf("the runner got %+v", got.Cases)
	}

	// All OK: exit 0; exact comparison sees the trailing spaces.
	r = cli("", "fn", "run", "--runtime", "cpp", p("main.cpp"), "--case", p("in1")+":"+p("out1"), "--case", p("in3"))
	if r.code != 0 || !strings.Contains(r.stdout, "OK: 2/2 cases OK") {
		t.Errorf("all OK: exit %d\n%s", r.code, r.stdout)
	}
	r = cli("", "fn", "run", "--runtime", "cpp", p("main.cpp"), "--case", p("in1")+":"+p("out1"), "--compare", "exact")
	if r.code != 1 || !strings.Contains(r.stdout, "wrong answer at line 1") {
		t.Errorf("exact: exit %d\n%s", r.code, r.stdout)
	}
	// One case a platform fault among failures: no verdict.
	r = cli("SANDBOX_ERROR", "fn", "run", "--runtime", "sh", "-", "--case", p("in1"))
	if r.code != 3 {
		t.Errorf("sandbox error case: exit %d\n%s", r.code, r.stdout)
	}
}

func TestFnRunJSONAndBinary(t *testing.T) {
	cli, fake := fnServer(t)
	bin := []byte{0x7f, 'E', 'L', 'F', 0xff, 0xfe, 0}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "prog"), bin, 0o755)
	os.WriteFile(filepath.Join(dir, "in.bin"), []byte{0xff, 0x00, 0x01}, 0o644)

	r := cli("", "fn", "run", "--runtime", "sh", filepath.Join(dir, "prog"), "--stdin", filepath.Join(dir, "in.bin"), "-o", "json")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var res api.FnResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("-o json: %v\n%s", err, r.stdout)
	}
	// Binary output stays base64 in JSON, losslessly.
	c := res.Cases[0]
	if out, _ := base64.StdEncoding.DecodeString(c.Stdout); res.Status != api.FnOK || c.StdoutEncoding != api.EncodingBase64 || !bytes.Equal(out, []byte{0xff, 0, 1}) {
		t.Errorf("json result: %+v", res)
	}
	// A binary source goes as the runtime's source file, base64.
	got := fake.Calls()[0]
	if got.Source != "" || len(got.Files) != 1 || got.Files[0].Path != "main.sh" || got.Files[0].Encoding != api.EncodingBase64 ||
		got.StdinEncoding != api.EncodingBase64 {
		t.Errorf("the runner got %+v", got)
	}
	if b, _ := base64.StdEncoding.DecodeString(got.Files[0].Content); !bytes.Equal(b, bin) {
		t.Errorf("source sent as %q", got.Files[0].Content)
	}
	// Binary stdout of a single run comes out raw.
	r = cli("", "fn", "run", "--runtime", "sh", filepath.Join(dir, "prog"), "--stdin", filepath.Join(dir, "in.bin"))
	if r.code != 0 || r.stdout != "\xff\x00\x01" {
		t.Errorf("raw stdout %q, exit %d", r.stdout, r.code)
	}
}

func TestFnRunErrors(t *testing.T) {
	cli, fake := fnServer(t)
	dir := writeFiles(t, map[string]string{"a.py": "x", "in": "1"})
	src := filepath.Join(dir, "a.py")
	for _, tc := range []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"no runtime", []string{src}, 2, "--runtime is required"},
		{"unknown runtime", []string{"--runtime", "cobol", src}, 2, "runtime_not_found"},
		{"no source", []string{"--runtime", "python3"}, 2, "needs a source file"},
		{"two sources", []string{"--runtime", "python3", src, src}, 2, "at most one source"},
		{"missing file", []string{"--runtime", "python3", filepath.Join(dir, "nope.py")}, 2, "nope.py"},
		{"missing case file", []string{"--runtime", "python3", src, "--case", filepath.Join(dir, "in") + ":" + filepath.Join(dir, "out")}, 2, "out"},
		{"stdin and cases", []string{"--runtime", "python3", src, "--stdin", filepath.Join(dir, "in"), "--case", filepath.Join(dir, "in")}, 2, "do not mix"},
		{"bad memory", []string{"--runtime", "python3", src, "--memory", "lots"}, 2, "--memory"},
		{"bad duration", []string{"--runtime", "python3", src, "--cpu-time", "soon"}, 2, "cpu-time"},
		{"bad compare", []string{"--runtime", "python3", src, "--compare", "fuzzy"}, 2, "--compare"},
		{"bad output", []string{"--runtime", "python3", src, "-o", "yaml"}, 2, "unknown output format"},
	} {
		r := cli("", append([]string{"fn", "run"}, tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.msg) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", tc.name, r.code, r.stderr, tc.code, tc.msg)
		}
	}
	// Overloaded past what the client waits for: no verdict, exit 3.
	fake.SetOverloaded(time.Minute)
	r := cli("", "fn", "run", "--runtime", "python3", src)
	if r.code != 3 || !strings.Contains(r.stderr, "fn_overloaded") {
		t.Errorf("overloaded: exit %d, stderr %q", r.code, r.stderr)
	}
	// A bad token is the caller's to fix.
	r = cli("", "--token", "wrong", "fn", "run", "--runtime", "python3", src)
	if r.code != 2 || !strings.Contains(r.stderr, "unauthenticated") {
		t.Errorf("bad token: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestFnRuntimes(t *testing.T) {
	cli, fake := fnServer(t)
	fake.SetUnavailable("sh", "environment fn-sh@1 is missing")
	r := cli("", "fn", "runtimes")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"NAME", "AVAILABLE", "READY", "ROOT", "python3", "yes", "read-only", "main.cpp", "cc main.cpp", "no: environment fn-sh@1 is missing", "1..4"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, r.stdout)
		}
	}
	r = cli("", "fn", "runtimes", "-o", "json")
	var list api.FnRuntimeList
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list.Runtimes) != 3 || list.Runtimes[2].Available {
		t.Errorf("-o json: %v %s", err, r.stdout)
	}
	if r := cli("", "fn", "runtimes", "extra"); r.code != 2 {
		t.Errorf("runtimes extra: exit %d", r.code)
	}
	if r := cli("", "fn", "nope"); r.code != 2 {
		t.Errorf("fn nope: exit %d", r.code)
	}
}
