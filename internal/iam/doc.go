// Package iam is warren's identity and admission core: the project tree
// with delegated quotas, tokens with roles scoped to a subtree, quota
// admission with in-flight reservations, per-project rate limits, and
// idempotency records. The apiserver calls it; it knows nothing of HTTP.
//
// # Projects and delegation
//
// Projects form a tree addressed by path ("" is the root, then "research",
// "research/rl-math"). Each has a Quota: sandboxes, vCPU, memory, disk and
// creates/s; a zero field sets no limit of the project's own. The model is
// a carve-out:
//
//   - A project's limit bounds the usage of its whole subtree.
//   - What a project delegates is the limits of its nearest limited
//     descendants on that dimension (levels without a limit of their own are
//     transparent and share their ancestor's pool). Delegated limits add up
//     to at most the project's own: a child alone, or the sum of its
//     siblings, exceeding the parent is refused (CodeQuotaExceedsParent), as
//     is shrinking a parent below what it delegated (CodeQuotaBelowChildren).
//   - Delegated capacity belongs to the child: admission keeps each child's
//     unused delegated headroom out of the parent's reach, so the parent's
//     own sandboxes use only what it did not hand down, and a child under its
//     quota is not starved by its parent (unless the parent's quota was
//     shrunk below its current usage; then the whole subtree waits until
//     usage drains).
//
// The whole tree is one store record (/iam/projects) written with
// CompareAndPut: every delegation rule spans a project and its
// sub-projects, and the store has no multi-key transactions, so one record
// is what makes concurrent edits safe. MaxProjects (default 4096) and a 1 MiB
// cap on the record keep it under etcd's request size limit. Each replica caches the tree and
// re-reads it every TreeRefresh (2s): that bounds how late a quota change
// made through another replica applies here.
//
// # Tokens
//
// A token's secret is random (SecretPrefix + 256 bits); only its sha256 is
// stored, under /iam/tokens/<id> where id is the hash's first 96 bits.
// Authenticate caches answers for AuthCacheTTL (5s): a revoke applies at
// once on the replica that made it and within 5s everywhere; expiry is
// checked on every call; a token whose project was deleted stops working
// within TreeRefresh (tokens carry the project's UID, so re-creating the
// path does not revive them). Authorize checks role × action and scope;
// CreateToken never mints a role above its creator's, a scope outside it,
// or a lifetime beyond it, so an agent holding an admin token can run its
// own sub-tree (sub-projects, their quotas, their tokens) and nothing else.
//
// # Admission
//
// Reserve counts, for a project and each limited ancestor, the usage the
// fleet view reports (UsageSource, over whole subtrees) plus this replica's
// in-flight reservations. A reservation lives until Release, or until
// CommitHold after Commit (so the sandbox is counted until the fleet view
// sees it), or ReservationTimeout. With one apiserver a burst over quota
// gets 429s and never overshoots: every admission decision and its
// reservation happen under one lock.
//
// Several apiservers each hold their own in-flight reservations, so until
// the fleet view catches up (one placement round plus the poll interval)
// each may admit the same remaining headroom: overshoot is bounded by
// (replicas-1) times the headroom a project had at the burst's start, and
// disappears at the next poll. Routing a project's creates to one replica
// (hash the project at the balancer) removes it; a store-backed lease per
// project (each replica leasing a slice of the headroom through
// CompareAndPut and renewing it in batches) would remove it without
// routing; it is not built, since it puts store writes back on the create
// path that the 5,000 creates/s target keeps free of them.
//
// AllowCreates takes from a token bucket owned by the nearest project with
// a creates/s limit; as with quotas, a delegated rate is carved out of the
// parent's bucket. Buckets are per replica too: R replicas allow up to R
// times the rate.
//
// # Idempotency
//
// Idempotency.Claim serialises creates per (project, key) through
// store.Create: the first writer holds the key, concurrent replays wait for
// its result, and a holder that vanished is taken over after ClaimTimeout;
// Complete fails if that happened, so the late creator can delete its
// duplicate. Completed keys replay for TTL (24h); Sweep deletes expired ones.
package iam
