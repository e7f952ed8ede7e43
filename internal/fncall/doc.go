// Package fncall is FnCall: stateless judge, compile and test jobs, each in
// a fresh container that is thrown away after the call.
//
// A node declares runtimes (Runtime: an environment, the file a call's
// source goes to, an optional compile step and the run command) and keeps,
// per runtime, a pool of pre-created containers (pool). A container (box)
// is warren-fninit (package fninit) as pid 1 of new mount, pid, IPC and UTS
// namespaces, in a network namespace with only lo recycled from earlier
// containers (netnsPool), and in its own memory, cpu, cpuacct and pids
// cgroups (cgroup, v1). fninit builds the root: an overlay of the runtime's
// EROFS layers over a size-capped tmpfs, a fresh /proc, a minimal /dev;
// then it drops every capability from the bounding set, sets
// no_new_privs, loads a seccomp filter and waits. The agent talks to it
// over one socket (package proto).
//
// Service.Run validates a call (limits against the node's maximum), waits
// for a run slot (MaxRunning calls at once per node), claims a container,
// writes the files, compiles once, and runs the program once per case as
// an unprivileged uid (box.exec): the agent sets the cgroup limits over the
// container's baseline, resets its peak, watches CPU time in cpuacct and
// asks fninit to kill the run past it; fninit enforces the wall time, the
// output caps and RLIMIT_FSIZE, and after every run kills whatever the run
// left behind. box.classify turns the exit, fninit's kill reason and the
// cgroup counters (CPU time, peak memory, OOM kills, refused forks) into a
// status; SandboxError is kept for platform faults. The container is then
// destroyed; the pool makes new ones in the background, grows with demand
// up to its maximum and refuses with 429 rather than queueing forever.
package fncall
