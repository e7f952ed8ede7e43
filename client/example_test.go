package client_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

func Example() {
	ctx := context.Background()
	c := client.New("http://127.0.0.1:7443", os.Getenv("WARREN_TOKEN"))

	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{
		Image:     "busybox",
		Resources: api.Resources{CPU: 1, Memory: 256 << 20},
		TTL:       api.Duration(30 * 60e9),
		Labels:    map[string]string{"task": "demo"},
	})
	if err != nil {
		log.Fatal(err) // client.IsExhausted(err) after retries: back off and try later
	}
	defer c.DeleteSandbox(ctx, sb.ID)

	if err := c.WriteFile(ctx, sb.ID, "/work/in.txt", 0o644, strings.NewReader("hello\n")); err != nil {
		log.Fatal(err)
	}
	res, err := c.ExecStream(ctx, sb.ID, api.ExecRequest{
		Argv:    []string{"cat", "/work/in.txt"},
		Timeout: api.Duration(10e9),
	}, os.Stdout, os.Stderr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit", res.ExitCode, "timed out", res.TimedOut)

	// docker cp semantics both ways; downloads are unpacked safely.
	if err := c.CopyFrom(ctx, sb.ID, "/work", "./results"); err != nil {
		log.Fatal(err)
	}
}
