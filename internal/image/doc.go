// Package image builds, stores and serves the read-only layers sandboxes
// are composed from, and the environments that stack them.
//
// # Layers
//
// A layer (kind base, workspace, toolkit or diff; named name@version) is an
// uncompressed EROFS image built with mkfs.erofs. In the blob store it is
// a set of content-addressed chunks plus one small JSON manifest blob
// (Manifest: schema, kind, parent, the image's sha256 and size, the chunk
// size, and the chunks' digests and sizes in order). The manifest's digest
// is the layer's identity: a node that has it needs nothing but the blob
// store to assemble the image (Cache.Fetch), and never reads etcd.
//
// Publishing writes the missing chunks, then the manifest, then the etcd
// record /layers/<name>@<version> with a create-only write, so a layer is
// visible whole or not at all, and an existing name@version is refused.
//
// # Chunk size: 1 MiB
//
// Chunks are the unit of deduplication now and of lazy loading later (a
// node will fetch chunks on first read through a FUSE file). Tasks read
// only 4-13% of their image, scattered over many files, so the unit should
// be small: with 1 MiB a task touching 40 MB of a 500 MB image fetches
// about that much, where 4 MiB chunks would fetch several times more for
// the many small files it opens. Smaller still (64-256 KiB) would multiply
// blob-store requests and manifest entries for little gain: 1 MiB is
// already where an object store's per-request latency and throughput
// balance, and it keeps a 500 MB layer at ~500 chunks and a ~50 KB
// manifest.
//
// EROFS puts each file's data at any 4 KiB block boundary, so the same
// file sits at different offsets modulo 1 MiB in two images and a plain
// 1 MiB grid would share almost no chunk between them. The grid therefore
// restarts at the start and end of the data of every file of at least
// 1 MiB (found by reading the image's directory tree); chunks are at most
// 1 MiB, and a large file common to two layers is cut into the same chunks
// in both and stored once. Small files packed together still differ with
// their neighbours: two layers share their large files' data, not their
// metadata or small files.
//
// # Environments
//
// An environment (/envs/<name>@<version>) is an immutable, ordered stack:
// one base, at most one workspace, then toolkits (overlay order: toolkits
// above the workspace above the base), with default env, workdir, user and
// entrypoint. Its layer refs are resolved to manifest digests when it is
// created. A ref without a version means the latest version, the greatest
// by CompareVersions. Upgrading a toolkit across environments creates new
// versions that share every other layer (CreateEnv with From): one record
// each, no blob written. The image a sandbox starts from (api.Image) is an
// environment resolved (Registry.Get) or an explicit layer list
// (Registry.ResolveLayers); busybox@1 is an environment with one base
// layer.
//
// # Garbage collection
//
// Deleting a layer is refused while an environment, a live sandbox or a
// diff layer on top uses it. Blobs are collected by reference (GC): roots
// are layer records, environments' layer digests, live sandboxes' layers
// and pins; a manifest keeps its chunks and parent. Publishes and
// environment creates pin what they are about to reference, and a sweep
// marker in etcd orders pins against collections (see gc.go), so a
// collection never deletes a chunk a concurrent publish found present and
// skipped writing. A grace period on blob age protects writers that do not
// pin.
//
// The package also holds the node side: the local layer cache (Cache) and
// reference-counted EROFS mounts shared by every sandbox on a node
// (Mounts).
package image
