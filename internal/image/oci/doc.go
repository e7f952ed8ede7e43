// Package oci imports OCI images into warren and exports environments back
// as OCI images, through go-containerregistry.
//
// Import reads a docker-archive tarball (`docker save`) or an OCI image
// layout, flattens the image's layers into one tree applying OCI whiteouts
// (Flatten), and publishes that tree as one base layer plus an
// environment carrying the image config's defaults. Flattening rather than
// one warren layer per OCI layer: image layers are not reused across
// environments the way warren's base/workspace/toolkit layers are, deep
// OCI stacks would cost overlay depth in every sandbox, and the flattened
// base is what later workspace and toolkit layers stack on.
//
// Export (ExportLayout) goes the other way: each warren layer, read from
// its mounted EROFS image, becomes one gzip OCI layer, with overlayfs
// whiteouts turned into .wh. entries.
//
// Archives come from strangers: every entry is extracted inside the
// target (openat2 RESOLVE_IN_ROOT via internal/rootfs), device nodes and
// names climbing out are refused, and sizes are bounded (Limits).
package oci
