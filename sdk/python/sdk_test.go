// Package python_test runs the Python SDK's own tests (sdk/python/tests)
// against an apiserver over the fake backend.
package python_test

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"

	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/node/nodetest"
	"github.com/warrenhq/warren/internal/testutil"
)

func TestPythonSDK(t *testing.T) {
	testutil.RequireBinary(t, "python3")
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Node:   nodetest.New(t, nil),
		Images: imagetest.Busybox,
		Tokens: apiserver.StaticToken("py-token"),
		Log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	}))
	defer srv.Close()
	cmd := exec.Command("python3", "-m", "unittest", "discover", "-s", "tests", "-v")
	cmd.Env = append(os.Environ(), "WARREN_ADDR="+srv.URL, "WARREN_TOKEN=py-token", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python tests: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
