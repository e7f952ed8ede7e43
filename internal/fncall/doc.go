// Package fncall is FnCall: stateless judge, compile and test jobs, each in
// a fresh container that is thrown away after the call.
//
// A node declares runtimes (Runtime: an environment, the file a call's
// source goes to, an optional compile step and the run command) and keeps,
// per runtime, a pool of pre-created containers (pool). Containers are made
// by the node's launcher, warren-fninit (cmd/warren-fninit, a small
// single-threaded C program; launcher.go): the agent starts it once, and it
// clones itself for each container, without an exec, into new mount, pid,
// IPC and UTS namespaces. A container (box) is that clone as pid 1, in a
// network namespace with only lo recycled from earlier containers
// (netnsPool) and in memory, cpuacct and pids cgroups of its own (cpu too
// when its runtime caps CPUs), recycled once empty (cgroupPool; on a
// cgroup v2 host one cgroup with memory and pids, and cpu when capped:
// cgroup.go). pid 1
// builds the root: by default the runtime's EROFS layer bound read-only
// with a size-capped tmpfs on /box, /tmp and /dev/shm (Runtime.WritableRoot,
// or a layer that cannot be bound so, gives an overlay over that tmpfs
// instead), a fresh /proc, the node's read-only /dev template (dev.go);
// it runs with an empty capability bounding set and no_new_privs, loads the
// seccomp filter the agent assembled (seccomp.go) and waits. The agent
// talks to the launcher and to each pid 1 over sockets (package proto).
// Making and ending a container this way costs ~1.5 ms of CPU, most of it
// the kernel's (namespaces, mounts, cgroup moves, process exits).
//
// Service.Run validates a call (limits against the node's maximum), waits
// for a run slot (MaxRunning calls at once per node, 2 per CPU), claims a
// container,
// writes the files, compiles once, and runs the program once per case as
// an unprivileged uid (box.exec): the agent sets the cgroup limits over the
// container's baseline, resets its peak, watches CPU time in cpuacct (v2: cpu.stat) and
// asks pid 1 to kill the run past it; pid 1 enforces the wall time, the
// output caps and RLIMIT_FSIZE, and after every run kills whatever the run
// left behind. box.classify turns the exit, pid 1's kill reason and the
// cgroup counters (CPU time, peak memory, OOM kills, refused forks) into a
// status; SandboxError is kept for platform faults. The container is then
// destroyed; the pool makes new ones in the background, grows with demand
// up to its maximum and refuses with 429 rather than queueing forever.
package fncall
