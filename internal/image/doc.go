// Package image builds, stores and serves the read-only EROFS layers that
// sandboxes are composed from: mkfs.erofs builds, the image registry (names
// to layer digests, kept in the store), the node's local layer cache fetched
// from the blob store, and reference-counted layer mounts shared by every
// sandbox on a node.
package image
