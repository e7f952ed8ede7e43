// Package regtest publishes test root filesystems into an image.Registry
// as base layers and environments, the way `warren layer build` and
// `warren env create` (or scripts/build-debian-image --register) do. It is
// apart from imagetest because package image's own tests import imagetest.
package regtest

import (
	"context"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/testutil"
)

// PublishRootfs publishes the directory rootfs as the base layer
// name@version and creates the environment name@version on it alone, as
// Registry.EnsureBusybox does for busybox. Either is kept if it exists, so
// tests sharing a registry may call it more than once. Building the layer
// costs an EROFS image of the tree and its chunks in the blob store.
func PublishRootfs(t testing.TB, reg *image.Registry, name, version, rootfs string) api.Environment {
	t.Helper()
	testutil.RequireBinary(t, "mkfs.erofs")
	env, err := reg.EnsureRootfs(context.Background(), name, version, rootfs)
	if err != nil {
		t.Fatalf("publish %s as %s@%s: %v", rootfs, name, version, err)
	}
	return env
}

// PublishDebian publishes the Debian runtime image variant ("python" or
// "gcc", see imagetest.DebianRootfs) under the name and version it was
// built as: debian-python@12, debian-gcc@12 on Debian 12. A sandbox or
// FnCall runtime then names the returned environment's Ref.
func PublishDebian(t testing.TB, reg *image.Registry, variant string) api.Environment {
	t.Helper()
	rootfs := imagetest.DebianRootfs(t, variant)
	stamp, err := imagetest.ImageStamp(rootfs)
	if err != nil || stamp["name"] == "" || stamp["version"] == "" {
		t.Fatalf("%s: no name and version in etc/warren-image: %v %v", rootfs, stamp, err)
	}
	return PublishRootfs(t, reg, stamp["name"], stamp["version"], rootfs)
}
