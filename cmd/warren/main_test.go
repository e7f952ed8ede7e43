package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client/clienttest"
)

type result struct {
	code           int
	stdout, stderr string
}

// cli runs the warren command line against srv with token "tok" in the
// environment unless env overrides it ("" deletes a variable).
func cli(t *testing.T, srv *clienttest.Server, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	vars := map[string]string{"WARREN_ADDR": srv.URL, "WARREN_TOKEN": "tok", "WARREN_DATA_DIR": t.TempDir()}
	for k, v := range env {
		vars[k] = v
	}
	var out, errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, getenv: func(k string) string { return vars[k] }}
	code := run(context.Background(), args, a)
	return result{code, out.String(), errOut.String()}
}

func newServer(t *testing.T, opts ...clienttest.Option) *clienttest.Server {
	t.Helper()
	srv := clienttest.NewServer(append([]clienttest.Option{clienttest.WithToken("tok")}, opts...)...)
	t.Cleanup(srv.Close)
	return srv
}

func mustCreate(t *testing.T, srv *clienttest.Server, args ...string) string {
	t.Helper()
	r := cli(t, srv, nil, "", append([]string{"sandbox", "create", "--image", "busybox"}, args...)...)
	if r.code != 0 {
		t.Fatalf("create: exit %d, stderr %q", r.code, r.stderr)
	}
	return strings.TrimSpace(r.stdout)
}

func TestSandboxLifecycle(t *testing.T) {
	srv := newServer(t)
	id := mustCreate(t, srv, "--cpu", "0.5", "--memory", "256Mi", "--ttl", "30m", "--idle-timeout", "10m",
		"--label", "task=demo", "--label", "run=1", "--env", "K=V", "--backend", "container")
	sb, ok := srv.Sandbox(id)
	if !ok {
		t.Fatalf("create printed %q, not a sandbox id", id)
	}
	if sb.Resources.CPU != 0.5 || sb.Resources.Memory != 256<<20 || sb.TTL.D().Minutes() != 30 ||
		sb.IdleTimeout.D().Minutes() != 10 || sb.Labels["task"] != "demo" || sb.Env["K"] != "V" {
		t.Errorf("server got %+v", sb)
	}
	other := mustCreate(t, srv, "--label", "task=other")

	r := cli(t, srv, nil, "", "sandbox", "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "ID") || !strings.Contains(r.stdout, "LABELS") ||
		!strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "run=1,task=demo") || !strings.Contains(r.stdout, "256Mi") {
		t.Errorf("ls: exit %d\n%s", r.code, r.stdout)
	}
	r = cli(t, srv, nil, "", "sandbox", "ls", "--label", "task=demo", "-o", "id")
	if r.stdout != id+"\n" {
		t.Errorf("ls --label task=demo -o id = %q, want %q", r.stdout, id+"\n")
	}
	r = cli(t, srv, nil, "", "sandbox", "ls", "-o", "json")
	var list api.SandboxList
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list.Sandboxes) != 2 {
		t.Errorf("ls -o json: %v %q", err, r.stdout)
	}

	r = cli(t, srv, nil, "", "sandbox", "get", id, "-o", "json")
	var got api.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.ID != id {
		t.Errorf("get -o json: %v %q", err, r.stdout)
	}
	r = cli(t, srv, nil, "", "sandbox", "get", id)
	if !strings.Contains(r.stdout, "State:") || !strings.Contains(r.stdout, "running") {
		t.Errorf("get: %q", r.stdout)
	}

	r = cli(t, srv, nil, "", "sandbox", "create", "--image", "busybox", "-o", "json")
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.Image != "busybox" {
		t.Errorf("create -o json: %v %q", err, r.stdout)
	}

	r = cli(t, srv, nil, "", "sandbox", "rm", id, other)
	if r.code != 0 || r.stdout != id+"\n"+other+"\n" {
		t.Errorf("rm: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	if _, ok := srv.Sandbox(id); ok {
		t.Error("sandbox still there after rm")
	}
}

func TestErrorsAndExitCodes(t *testing.T) {
	srv := newServer(t)
	for _, tc := range []struct {
		name   string
		env    map[string]string
		args   []string
		code   int
		stderr string
	}{
		{"api error", nil, []string{"sandbox", "get", "n1-nope"}, 1, "warren: sandbox n1-nope not found (sandbox_not_found)\n"},
		{"image not found", nil, []string{"sandbox", "create", "--image", "nope"}, 1, "warren: image nope not found (image_not_found)\n"},
		{"missing image flag", nil, []string{"sandbox", "create"}, 2, "warren: --image is required"},
		{"unknown flag", nil, []string{"sandbox", "ls", "--nope"}, 2, "unknown flag"},
		{"unknown command", nil, []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"unknown subcommand", nil, []string{"sandbox", "frob"}, 2, `unknown command "frob"`},
		{"bad label", nil, []string{"sandbox", "create", "--image", "busybox", "--label", "novalue"}, 2, "want KEY=VALUE"},
		{"bad memory", nil, []string{"sandbox", "create", "--image", "busybox", "--memory", "lots"}, 2, "--memory"},
		{"bad output", nil, []string{"sandbox", "ls", "-o", "yaml"}, 2, "unknown output format"},
		{"get needs id", nil, []string{"sandbox", "get"}, 2, "one sandbox id"},
		{"no token", map[string]string{"WARREN_TOKEN": ""}, []string{"sandbox", "ls"}, 1, "(unauthenticated); no token found"},
		{"bad token flag", nil, []string{"--token", "wrong", "sandbox", "ls"}, 1, "(unauthenticated)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := cli(t, srv, tc.env, "", tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.stderr) {
				t.Errorf("exit %d stderr %q; want exit %d and %q", r.code, r.stderr, tc.code, tc.stderr)
			}
		})
	}
}

func TestTokenFromDataDir(t *testing.T) {
	srv := newServer(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "admin-token"), []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := cli(t, srv, map[string]string{"WARREN_TOKEN": "", "WARREN_DATA_DIR": dir}, "", "sandbox", "ls")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
}

func TestExec(t *testing.T) {
	srv := newServer(t)
	id := mustCreate(t, srv)
	for _, tc := range []struct {
		name           string
		stdin          string
		args           []string
		code           int
		stdout, stderr string
	}{
		{"echo", "", []string{"exec", id, "--", "echo", "hi", "there"}, 0, "hi there\n", ""},
		{"no dashes", "", []string{"exec", id, "echo", "hi"}, 0, "hi\n", ""},
		{"exit code", "", []string{"exec", id, "--", "exit", "3"}, 3, "", ""},
		{"stderr", "", []string{"exec", id, "--", "warn", "careful"}, 0, "", "careful\n"},
		{"not found", "", []string{"exec", id, "--", "nope"}, 127, "", "nope: not found\n"},
		{"shell form", "", []string{"exec", id, "--sh", "echo from sh"}, 0, "from sh\n", ""},
		{"timeout", "", []string{"exec", id, "--timeout", "20ms", "--", "sleep", "5"}, 124, "", "warren: exec timed out after 20ms\n"},
		{"stdin", "line\n", []string{"exec", "-i", id, "--", "cat"}, 0, "line\n", ""},
		{"binary stdin", "\xff\x00\xfe", []string{"exec", id, "-i", "--", "cat"}, 0, "\xff\x00\xfe", ""},
		{"no stdin without -i", "ignored", []string{"exec", id, "--", "cat"}, 0, "", ""},
		{"truncated", "", []string{"exec", id, "--max-output", "4", "--", "echo", "0123456789"}, 0, "0123",
			"warren: stdout truncated: showed 4B of 11B (raise --max-output)\n"},
		{"no command", "", []string{"exec", id}, 2, "", "exactly one of"},
		{"argv and sh", "", []string{"exec", id, "--sh", "x", "--", "echo"}, 2, "", "exactly one of"},
		{"no sandbox", "", []string{"exec"}, 2, "", "needs a sandbox id"},
		{"missing sandbox", "", []string{"exec", "n1-nope", "--", "true"}, 1, "", "(sandbox_not_found)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := cli(t, srv, nil, tc.stdin, tc.args...)
			if r.code != tc.code || r.stdout != tc.stdout || !strings.Contains(r.stderr, tc.stderr) || (tc.stderr == "" && r.stderr != "") {
				t.Errorf("got exit %d stdout %q stderr %q; want %d %q %q", r.code, r.stdout, r.stderr, tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}

func TestExecSignalAndStreamError(t *testing.T) {
	srv := newServer(t, clienttest.WithExec(func(ctx context.Context, sb api.Sandbox, req api.ExecRequest, stdin []byte, stdout, stderr io.Writer) (api.ExecResult, error) {
		switch req.Argv[0] {
		case "oom":
			io.WriteString(stdout, "allocating\n")
			return api.ExecResult{ExitCode: -1, Signal: "SIGKILL"}, nil
		case "vanish":
			io.WriteString(stdout, "partial")
			return api.ExecResult{}, clienttest.Fail(503, api.CodeUnavailable, "node lost")
		}
		return api.ExecResult{}, nil
	}))
	id := mustCreate(t, srv)
	r := cli(t, srv, nil, "", "exec", id, "--", "oom")
	if r.code != 137 || r.stdout != "allocating\n" || !strings.Contains(r.stderr, "killed by SIGKILL") {
		t.Errorf("oom: %+v", r)
	}
	r = cli(t, srv, nil, "", "exec", id, "--", "vanish")
	if r.code != 1 || r.stdout != "partial" || r.stderr != "warren: node lost (unavailable)\n" {
		t.Errorf("vanish: %+v", r)
	}
}

func TestCp(t *testing.T) {
	srv := newServer(t)
	id := mustCreate(t, srv)
	local := t.TempDir()
	os.WriteFile(filepath.Join(local, "main.py"), []byte("print(1)\n"), 0o755)
	os.MkdirAll(filepath.Join(local, "task", "data"), 0o755)
	os.WriteFile(filepath.Join(local, "task", "data", "in.txt"), []byte("input"), 0o644)

	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"cp", filepath.Join(local, "main.py"), id + ":/work/"}, 0},
		{[]string{"cp", filepath.Join(local, "task"), id + ":/work"}, 0},
		{[]string{"cp", filepath.Join(local, "task"), id + ":/fresh"}, 0},
	} {
		if r := cli(t, srv, nil, "", tc.args...); r.code != tc.code {
			t.Fatalf("%v: exit %d %s", tc.args, r.code, r.stderr)
		}
	}
	for p, want := range map[string]string{"/work/main.py": "print(1)\n", "/work/task/data/in.txt": "input", "/fresh/data/in.txt": "input"} {
		if got, _, ok := srv.File(id, p); !ok || string(got) != want {
			t.Errorf("%s = %q (%v), want %q", p, got, ok, want)
		}
	}
	if _, mode, _ := srv.File(id, "/work/main.py"); mode != 0o755 {
		t.Errorf("main.py mode %v", mode)
	}

	out := t.TempDir()
	if r := cli(t, srv, nil, "", "cp", id+":/work/main.py", out); r.code != 0 {
		t.Fatalf("cp out file: %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "main.py")); string(b) != "print(1)\n" {
		t.Errorf("main.py = %q", b)
	}
	if r := cli(t, srv, nil, "", "cp", id+":/work/task", filepath.Join(out, "t2")); r.code != 0 {
		t.Fatalf("cp out dir: %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "t2", "data", "in.txt")); string(b) != "input" {
		t.Errorf("t2/data/in.txt = %q", b)
	}

	r := cli(t, srv, nil, "", "cp", id+":/work/task", "-")
	tr := tar.NewReader(strings.NewReader(r.stdout))
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if strings.Join(names, " ") != "task/ task/data/ task/data/in.txt" {
		t.Errorf("cp to - gave entries %q", names)
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "piped.txt", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg})
	tw.Write([]byte("ok"))
	tw.Close()
	if r := cli(t, srv, nil, buf.String(), "cp", "-", id+":/work/in"); r.code != 0 {
		t.Fatalf("cp from -: %+v", r)
	}
	if got, _, _ := srv.File(id, "/work/in/piped.txt"); string(got) != "ok" {
		t.Errorf("piped.txt = %q", got)
	}

	for _, args := range [][]string{{"cp", "a", "b"}, {"cp", id + ":/a", id + ":/b"}, {"cp", "a"}} {
		if r := cli(t, srv, nil, "", args...); r.code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, r.code, r.stderr)
		}
	}
	if r := cli(t, srv, nil, "", "cp", id+":/work/missing", out); r.code != 1 || !strings.Contains(r.stderr, "(file_not_found)") {
		t.Errorf("missing: %+v", r)
	}
}

func TestImageAndNodeLs(t *testing.T) {
	srv := newServer(t)
	r := cli(t, srv, nil, "", "image", "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "NAME") || !strings.Contains(r.stdout, "busybox") {
		t.Errorf("image ls: %+v", r)
	}
	r = cli(t, srv, nil, "", "node", "ls", "-o", "json")
	var nodes api.NodeList
	if err := json.Unmarshal([]byte(r.stdout), &nodes); err != nil || len(nodes.Nodes) != 1 {
		t.Errorf("node ls -o json: %v %q", err, r.stdout)
	}
	r = cli(t, srv, nil, "", "node", "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "HEALTHY") || !strings.Contains(r.stdout, "n1") {
		t.Errorf("node ls: %+v", r)
	}
	lines := strings.Split(r.stdout, "\n")
	head, row := strings.Fields(lines[0]), strings.Fields(lines[1])
	if len(head) != 17 || head[5] != "LAYERS" || head[8] != "IN-USE" || head[10] != "QOS" || head[11] != "MERGE" || head[12] != "DISK-QUOTA" || head[13] != "NETWORK" || head[14] != "SECURITY" || head[15] != "SNAPSHOTS" || head[16] != "PROBLEMS" || len(row) < 16 ||
		!slices.Contains([]string{"-", "eager", "lazy"}, row[5]) ||
		row[8] != "-" && !strings.HasPrefix(row[8], "cpu:") ||
		row[10] != "-" && !strings.HasPrefix(row[10], "be:") ||
		row[11] != "-" && row[11] != "off" && !strings.HasPrefix(row[11], "ksm") ||
		!slices.Contains([]string{"-", "none", "btrfs", "xfs", "ext4"}, row[12]) || !slices.Contains([]string{"yes", "no"}, row[13]) || row[14] != "-" && !strings.HasPrefix(row[14], "7-measures,landlock:") ||
		!slices.Contains([]string{"-", "filesystem"}, row[15]) {
		t.Errorf("node ls: header %q, row %q; want LAYERS after BACKENDS, IN-USE, QOS and MERGE, and DISK-QUOTA, NETWORK, SECURITY and SNAPSHOTS columns before PROBLEMS", head, row)
	}
}

// TestSandboxRuntime: --runtime reaches the create, sandbox get shows
// it, and node ls shows the runtimes a node runs besides the default.
func TestSandboxRuntime(t *testing.T) {
	srv := newServer(t)
	id := mustCreate(t, srv, "--runtime", "gvisor")
	if sb, ok := srv.Sandbox(id); !ok || sb.Runtime != api.RuntimeGVisor {
		t.Fatalf("server got %+v, want runtime gvisor", sb)
	}
	if r := cli(t, srv, nil, "", "sandbox", "get", id); r.code != 0 || !strings.Contains(r.stdout, "Runtime:") || !strings.Contains(r.stdout, "gvisor") {
		t.Errorf("sandbox get: %+v", r)
	}
	r := cli(t, srv, nil, "", "node", "ls")
	if lines := strings.Split(r.stdout, "\n"); r.code != 0 || len(lines) < 2 || strings.Fields(lines[1])[4] != "container+gvisor" {
		t.Errorf("node ls: %+v, want BACKENDS container+gvisor", r)
	}
	n := api.Node{Backends: []string{"container", "microvm"}, Machines: []api.NodeMachine{{Backend: "microvm", Accel: api.AccelTCG}},
		Runtimes: []api.NodeRuntime{{Backend: "container", Name: "runc", Available: true}, {Backend: "container", Name: "gvisor", Reason: "runsc not found"}}}
	if got := backendSummary(n); got != "container,microvm(tcg)" {
		t.Errorf("backends with gvisor unavailable: %q, want container,microvm(tcg)", got)
	}
}

func TestSandboxCreateDisk(t *testing.T) {
	srv := newServer(t)
	id := mustCreate(t, srv, "--disk", "10Gi", "--disk-inodes", "5000")
	sb, ok := srv.Sandbox(id)
	if !ok || sb.Resources.Disk != 10<<30 || sb.Resources.DiskInodes != 5000 {
		t.Fatalf("server got %+v, want disk 10Gi and 5000 inodes", sb.Resources)
	}
	if r := cli(t, srv, nil, "", "sandbox", "get", id); r.code != 0 || !strings.Contains(r.stdout, "10Gi (5000 inodes)") {
		t.Errorf("sandbox get: %+v", r)
	}
	if r := cli(t, srv, nil, "", "sandbox", "create", "--image", "busybox", "--disk", "lots"); r.code != 2 || !strings.Contains(r.stderr, "--disk") {
		t.Errorf("--disk lots: %+v, want usage error", r)
	}
}

func TestSplitRemote(t *testing.T) {
	for _, tc := range []struct {
		in     string
		id     string
		path   string
		remote bool
	}{
		{"n1-1:/work", "n1-1", "/work", true},
		{"n1-1:/a:b", "n1-1", "/a:b", true},
		{"./a:b", "", "./a:b", false},
		{"/abs/a:b", "", "/abs/a:b", false},
		{"dir/a:b", "", "dir/a:b", false},
		{":x", "", ":x", false},
		{"file.txt", "", "file.txt", false},
		{"-", "", "-", false},
	} {
		id, p, remote := splitRemote(tc.in)
		if id != tc.id || p != tc.path || remote != tc.remote {
			t.Errorf("splitRemote(%q) = %q %q %v, want %q %q %v", tc.in, id, p, remote, tc.id, tc.path, tc.remote)
		}
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		res  api.ExecResult
		want int
	}{
		{api.ExecResult{ExitCode: 0}, 0},
		{api.ExecResult{ExitCode: 42}, 42},
		{api.ExecResult{ExitCode: 137, Signal: "SIGKILL"}, 137},
		{api.ExecResult{ExitCode: -1, Signal: "SIGSEGV"}, 139},
		{api.ExecResult{Signal: "TERM"}, 143},
		{api.ExecResult{ExitCode: 1000}, 255},
	} {
		if got := exitCode(&tc.res); got != tc.want {
			t.Errorf("exitCode(%+v) = %d, want %d", tc.res, got, tc.want)
		}
	}
}

func TestSandboxCreateGang(t *testing.T) {
	srv := newServer(t)
	out := mustCreate(t, srv, "--count", "3", "--all-or-none", "--label", "task=g")
	ids := strings.Fields(out)
	if len(ids) != 3 {
		t.Fatalf("--count 3 printed %q, want 3 ids", out)
	}
	gang := ""
	for i, id := range ids {
		sb, ok := srv.Sandbox(id)
		if !ok {
			t.Fatalf("%q is not a sandbox id", id)
		}
		if gang == "" {
			gang = sb.Labels[api.LabelGang]
		}
		if gang == "" || sb.Labels[api.LabelGang] != gang || sb.Labels[api.LabelGangIndex] != strconv.Itoa(i) || sb.Labels["task"] != "g" {
			t.Errorf("member %d labels %v", i, sb.Labels)
		}
	}
	if r := cli(t, srv, nil, "", "sandbox", "create", "--image", "busybox", "--count", "0"); r.code != 2 {
		t.Errorf("--count 0: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestSandboxNetworkFlags(t *testing.T) {
	srv := newServer(t)
	id := mustCreate(t, srv, "--allow", "pypi.org", "--allow", "*.pythonhosted.org", "--allow", "198.51.100.0/24:443")
	sb, _ := srv.Sandbox(id)
	if sb.Network == nil || sb.Network.Mode != api.NetworkAllowlist || !slices.Equal(sb.Network.Allow, []string{"pypi.org", "*.pythonhosted.org", "198.51.100.0/24:443"}) {
		t.Fatalf("create --allow: server got network %+v", sb.Network)
	}
	open := mustCreate(t, srv, "--network", "open")
	if sb, _ := srv.Sandbox(open); sb.Network == nil || sb.Network.Mode != api.NetworkOpen {
		t.Errorf("create --network open: %+v", sb.Network)
	}
	for _, bad := range [][]string{{"--network", "open", "--allow", "a.com"}, {"--network", "sideways"}} {
		if r := cli(t, srv, nil, "", append([]string{"sandbox", "create", "--image", "busybox"}, bad...)...); r.code != 2 {
			t.Errorf("create %v: %+v, want a usage error", bad, r)
		}
	}
	if r := cli(t, srv, nil, "", "sandbox", "get", id); r.code != 0 || !strings.Contains(r.stdout, "allowlist pypi.org, *.pythonhosted.org") {
		t.Errorf("sandbox get: %+v", r)
	}
	if r := cli(t, srv, nil, "", "sandbox", "network", id, "--deny-all"); r.code != 0 || !strings.Contains(r.stdout, "none") {
		t.Errorf("network --deny-all: %+v", r)
	}
	if sb, _ := srv.Sandbox(id); sb.Network != nil {
		t.Errorf("after --deny-all: %+v", sb.Network)
	}
	if r := cli(t, srv, nil, "", "sandbox", "network", id, "--allow", "github.com", "-o", "json"); r.code != 0 || !strings.Contains(r.stdout, `"github.com"`) {
		t.Errorf("network --allow: %+v", r)
	}
	if r := cli(t, srv, nil, "", "sandbox", "network", id, "--deny-all", "--open"); r.code != 2 {
		t.Errorf("--deny-all --open: %+v, want a usage error", r)
	}
}
