package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/fncall"
	"github.com/warrenhq/warren/internal/image"
)

// FnConfig configures a node's FnCall service (`--fn-runtimes`, `--no-fn`).
type FnConfig struct {
	// Disabled turns FnCall off on this node.
	Disabled bool
	// RuntimesFile is a JSON file declaring the runtimes ({"runtimes":
	// [fncall.Runtime...]}); empty means fncall.DefaultRuntimes.
	RuntimesFile string
}

// startFn starts the node's FnCall service, or returns nil (and says why in
// the log) when it is off or this host cannot run it: the node serves
// sandboxes either way.
func startFn(cfg FnConfig, nodeID, nodeDir string, images fncall.Images, layers fncall.Layers, mounts fncall.Mounts, log *slog.Logger) (*fncall.Service, error) {
	if cfg.Disabled {
		return nil, nil
	}
	var runtimes []fncall.Runtime
	if cfg.RuntimesFile != "" {
		b, err := os.ReadFile(cfg.RuntimesFile)
		if err != nil {
			return nil, fmt.Errorf("fn runtimes: %w", err)
		}
		var f struct {
			Runtimes []fncall.Runtime `json:"runtimes"`
		}
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("fn runtimes %s: %w", cfg.RuntimesFile, err)
		}
		runtimes = f.Runtimes
	}
	svc, err := fncall.New(fncall.Config{
		Runtimes:     runtimes,
		Images:       images,
		Layers:       layers,
		Mounts:       mounts,
		StateDir:     filepath.Join(nodeDir, "fn"),
		CgroupParent: "/warren/" + nodeID + "/fn",
		Log:          log,
	})
	if err != nil {
		return nil, err
	}
	if err := svc.Available(); err != nil {
		log.Warn("fncall unavailable on this node", "err", err)
		return nil, nil
	}
	svc.Start()
	return svc, nil
}

// apiImages resolves environments through an apiserver, for agents that
// join with --apiserver and have no store of their own.
type apiImages struct{ c *client.Client }

func (a apiImages) Get(ctx context.Context, name string) (api.Image, error) {
	img, err := a.c.GetImage(ctx, name)
	if err != nil {
		return api.Image{}, err
	}
	return *img, nil
}

// DefaultImageCache is where scripts/build-runtime-images leaves the
// runtime images it builds (WARREN_IMAGE_CACHE overrides it).
const DefaultImageCache = "/var/cache/warren/images"

// publishCached publishes the runtime images built on this host that are
// not environments yet, so that FnCall's default runtimes work on `warren
// up` without a registering step.
func publishCached(ctx context.Context, images *image.Registry, dir string, log *slog.Logger) {
	if dir == "" {
		dir = os.Getenv("WARREN_IMAGE_CACHE")
	}
	if dir == "" {
		dir = DefaultImageCache
	}
	start := time.Now()
	envs, err := images.PublishCached(ctx, dir)
	if err != nil && ctx.Err() == nil {
		log.Warn("publish cached runtime images", "dir", dir, "err", err)
	}
	if len(envs) > 0 {
		log.Info("runtime images ready", "envs", envs, "took", time.Since(start).Round(time.Millisecond))
	}
}
