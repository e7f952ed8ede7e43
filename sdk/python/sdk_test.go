// Package python_test runs the Python SDK's own tests (sdk/python/tests)
// against an apiserver over the fake backend, with projects and tokens
// (IAM over an in-memory store) and the root admin secret as WARREN_TOKEN.
package python_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/fake"
	"github.com/warrenhq/warren/internal/fncall/fncalltest"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodetest"
	"github.com/warrenhq/warren/internal/store"
	"github.com/warrenhq/warren/internal/testutil"
)

const rootSecret = "py-root-admin-secret"

func TestPythonSDK(t *testing.T) {
	testutil.RequireBinary(t, "python3")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := store.Memory()
	usage := apiserver.NewUsage()
	m := iam.New(st, iam.Options{Usage: usage, CommitHold: -1, QuotaRetryAfter: time.Second})
	if _, err := m.EnsureAdmin(ctx, rootSecret); err != nil {
		t.Fatal(err)
	}
	// The fake stands in for a container backend that runs gVisor too.
	agent := nodetest.New(t, func(c *node.Config) {
		b, err := fake.New(filepath.Join(t.TempDir(), "fake"), fake.Options{Name: api.BackendContainer,
			Runtimes: []string{api.RuntimeRunc, api.RuntimeGVisor}})
		if err != nil {
			t.Fatal(err)
		}
		c.Backends = []backend.Backend{b}
	})
	go usage.Follow(ctx, agent, 50*time.Millisecond)
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Node: agent, Images: imagetest.Busybox, Usage: usage, Fn: fncalltest.New("python3", "cpp"),
		Tokens: m, IAM: m, Idempotency: iam.NewIdempotency(st, iam.IdempotencyOptions{}),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}))
	defer srv.Close()
	cmd := exec.Command("python3", "-m", "unittest", "discover", "-s", "tests", "-v")
	cmd.Env = append(os.Environ(), "WARREN_ADDR="+srv.URL, "WARREN_TOKEN="+rootSecret, "WARREN_FN_FAKE=1", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python tests: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
