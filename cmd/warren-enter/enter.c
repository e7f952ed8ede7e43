// warren-enter: how the node agent runs a command inside a container
// sandbox (internal/backend/container's Exec). It replaces `runc exec`.
//
// Why a launcher of our own: runc exec is a Go program that re-executes
// itself, runs a C constructor to join the namespaces, and compiles the
// seccomp profile again with libseccomp on every call: ~20 ms for `true`,
// where entering the same namespaces with nsenter takes ~2 ms. Agents make
// hundreds of tool calls per rollout, so that is rollout time. And the
// platform must own the path: nothing here reads a file the sandbox can
// change. Policy stays in Go: the agent sends everything (the user, groups,
// capabilities, rlimits, the seccomp filter exactly as the sandbox's init
// runs it, the cwd, argv and environment, optionally a binary to run by
// descriptor: the platform's trusted shell); this file only carries it out.
//
// Descriptors from the agent:
//   0-2  the command's stdin, stdout and stderr
//   3    the request (a memfd; format below, written by
//        internal/backend/container/enter.go)
//   4    a pidfd of the sandbox's init: the namespaces to join
//   5    the status pipe: one line, read by the agent
//   6..  the cgroup.procs files to join, and the binary to run if any
//
// Steps: join every namespace of the init at once (setns on the pidfd), then
// fork (a pid namespace applies to children). The child joins the cgroups,
// asks for the AppArmor profile (where the host runs AppArmor), sets groups, gid, uid (keeping capabilities), rlimits and the umask,
// enters the working directory as the user, sets the capability sets and
// bounding set, no_new_privs, Landlock (the sandbox's root and nothing
// outside it), loads the seccomp filters and execs. The
// parent waits for it and writes how it ended: "exit N", "signal N", or
// "error STAGE ERRNO" if it never ran (STAGE "exec" with ENOENT means not
// found). A failed step in the child is sent back on a close-on-exec pipe,
// so a successful exec closes it with nothing written.
//
// `warren-enter merge PROG ARGS...` is another use: it opts itself into
// KSM and execs PROG (the runtime creating a sandbox whose memory merges;
// see main). `warren-enter hold` holds a user namespace (userns.go).
//
// Containment of the launcher itself: it is non-dumpable from its first
// instruction, so nothing in the sandbox may ptrace it or open its
// /proc/<pid>/exe, fds, root or memory while it runs there (CVE-2019-5736);
// it dies with the agent (PDEATHSIG); the child closes every descriptor but
// 0-2 before exec. The parent stays in the host's pid namespace, where the
// sandbox cannot see it.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define REQ_FD 3
#define PIDFD 4
#define STATUS_FD 5
#define MAGIC 0x354e4557u // "WEN5": the request format's version
#define MAX_FILTERS 8

#define PR_SET_MEMORY_MERGE_ 67 // Linux 6.4; inherited across exec since 6.7

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

// status writes the one line the agent reads ("WHAT N") and exits.
static void status(const char *what, long n) {
	char line[96];
	int m = snprintf(line, sizeof line, "%s %ld\n", what, n);
	if (write(STATUS_FD, line, m) != m)
		_exit(2);
	_exit(0);
}

// ---- the request ------------------------------------------------------------

typedef struct {
	const char *p;
	size_t left;
} reader;

static void bad_request(void) { status("error request", EINVAL); }

static uint64_t get_u64(reader *r) {
	uint64_t v;
	if (r->left < 8)
		bad_request();
	memcpy(&v, r->p, 8); // little-endian hosts only, as the agent writes it
	r->p += 8;
	r->left -= 8;
	return v;
}

static const char *get_bytes(reader *r, size_t *n) {
	uint64_t l = get_u64(r);
	if (l > r->left)
		bad_request();
	const char *p = r->p;
	r->p += l;
	r->left -= l;
	*n = l;
	return p;
}

// get_str returns a NUL-terminated copy; a NUL inside is a bad request.
static char *get_str(reader *r) {
	size_t n;
	const char *p = get_bytes(r, &n);
	if (memchr(p, 0, n))
		bad_request();
	char *s = malloc(n + 1);
	if (!s)
		status("error memory", ENOMEM);
	memcpy(s, p, n);
	s[n] = 0;
	return s;
}

// get_strs returns a NULL-terminated array.
static char **get_strs(reader *r) {
	uint64_t n = get_u64(r);
	if (n > r->left / 8)
		bad_request();
	char **v = calloc(n + 1, sizeof *v);
	if (!v)
		status("error memory", ENOMEM);
	for (uint64_t i = 0; i < n; i++)
		v[i] = get_str(r);
	return v;
}

struct request {
	uint64_t uid, gid;
	uint64_t ngroups;
	gid_t *groups;
	uint64_t cap_effective, cap_permitted, cap_bounding;
	uint64_t nrlimits;
	struct {
		uint64_t resource, soft, hard;
	} *rlimits;
	uint64_t umask;
	char *cwd;
	char **argv, **env;
	int64_t exec_fd; // -1: look argv[0] up in the environment's PATH
	uint64_t nfilters;
	struct sock_fprog filters[MAX_FILTERS]; // in the order to load them
	uint64_t ncgroups;
	int cgroups[16]; // cgroup.procs descriptors
	uint64_t landlock_handled, landlock_allowed; // 0: no Landlock
	uint64_t userns; // the sandbox has a user namespace of its own to join
	char *apparmor;  // the AppArmor profile to exec under; "": none
	uint64_t sched_idle; // run under SCHED_IDLE (a best-effort sandbox)
	uint64_t core_share; // share the sandbox init's core scheduling cookie
	uint64_t memory_merge; // opt into KSM, as the sandbox's init is
	int64_t oom_score_adj; // the sandbox's, as its init's (internal/qos)
};

static void read_request(struct request *q) {
	struct stat st;
	if (fstat(REQ_FD, &st) < 0)
		status("error request", errno);
	if (st.st_size <= 0 || st.st_size > (64 << 20))
		bad_request();
	char *p = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, REQ_FD, 0);
	if (p == MAP_FAILED)
		status("error request", errno);
	reader r = {p, st.st_size};
	if (get_u64(&r) != MAGIC)
		status("error version", EPROTO); // an agent of another build
	q->uid = get_u64(&r);
	q->gid = get_u64(&r);
	q->ngroups = get_u64(&r);
	if (q->ngroups > 65536)
		bad_request();
	q->groups = calloc(q->ngroups + 1, sizeof *q->groups);
	for (uint64_t i = 0; i < q->ngroups; i++)
		q->groups[i] = get_u64(&r);
	q->cap_effective = get_u64(&r);
	q->cap_permitted = get_u64(&r);
	q->cap_bounding = get_u64(&r);
	q->nrlimits = get_u64(&r);
	if (q->nrlimits > 64)
		bad_request();
	q->rlimits = calloc(q->nrlimits + 1, sizeof *q->rlimits);
	for (uint64_t i = 0; i < q->nrlimits; i++) {
		q->rlimits[i].resource = get_u64(&r);
		q->rlimits[i].soft = get_u64(&r);
		q->rlimits[i].hard = get_u64(&r);
	}
	q->umask = get_u64(&r);
	q->cwd = get_str(&r);
	q->argv = get_strs(&r);
	q->env = get_strs(&r);
	q->exec_fd = (int64_t)get_u64(&r);
	q->nfilters = get_u64(&r);
	if (q->nfilters > MAX_FILTERS)
		bad_request();
	for (uint64_t i = 0; i < q->nfilters; i++) {
		size_t n;
		const char *f = get_bytes(&r, &n);
		if (n == 0 || n % sizeof(struct sock_filter) || n / sizeof(struct sock_filter) > BPF_MAXINSNS)
			bad_request();
		q->filters[i].len = n / sizeof(struct sock_filter);
		q->filters[i].filter = (struct sock_filter *)f; // the mapping stays
	}
	q->ncgroups = get_u64(&r);
	if (q->ncgroups > 16)
		bad_request();
	for (uint64_t i = 0; i < q->ncgroups; i++)
		q->cgroups[i] = get_u64(&r);
	q->landlock_handled = get_u64(&r);
	q->landlock_allowed = get_u64(&r);
	q->userns = get_u64(&r);
	q->apparmor = get_str(&r);
	q->sched_idle = get_u64(&r);
	q->core_share = get_u64(&r);
	q->memory_merge = get_u64(&r);
	q->oom_score_adj = (int64_t)get_u64(&r);
	if (q->oom_score_adj < -1000 || q->oom_score_adj > 1000)
		bad_request();
	if (!q->argv[0] || !q->argv[0][0] || r.left)
		bad_request();
}

// ---- the child ----------------------------------------------------------------

static int errpipe; // the child's end: one failure record, or closed by exec

// fail sends the failed step back to the parent and exits.
static void fail(int stage, int err) {
	int rec[2] = {stage, err};
	if (write(errpipe, rec, sizeof rec) < 0) {
		// Nothing to do: the parent then reports how the child exited.
	}
	_exit(127);
}

enum { S_CGROUP = 1, S_APPARMOR, S_GROUPS, S_GID, S_UID, S_RLIMIT, S_CWD, S_CAPS, S_NNP, S_LANDLOCK, S_SECCOMP, S_EXEC, S_SCHED, S_MERGE };
static const char *stages[] = {"", "cgroup", "apparmor", "groups", "gid", "uid", "rlimit", "cwd", "caps", "nnp", "landlock", "seccomp", "exec", "sched", "merge"};

#define CHECK(call, stage)                                                                         \
	do {                                                                                       \
		if ((call) < 0)                                                                    \
			fail(stage, errno);                                                        \
	} while (0)

// landlock confines the process and everything it starts to the file
// hierarchy beneath the sandbox's root, with the rights the agent allows
// there (all but making device nodes): a path that leads out of it (a
// host process's /proc/<pid>/root, a descriptor that leaked in) opens
// nothing, whatever else went wrong. Rights this kernel's Landlock does
// not know are dropped from both sets. Landlock ABI 1 is not used: it
// denies every rename and link across directories (REFER).
static void landlock(struct request *q) {
	struct {
		uint64_t handled_access_fs;
	} attr;
	struct {
		uint64_t allowed_access;
		int32_t parent_fd;
	} __attribute__((packed)) rule;
	long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, 1 /* LANDLOCK_CREATE_RULESET_VERSION */);
	if (abi < 2)
		fail(S_LANDLOCK, abi < 0 ? errno : ENOSYS);
	uint64_t known = (1ull << 14) - 1; // ABI 2: EXECUTE .. REFER
	if (abi >= 3)
		known |= 1ull << 14; // TRUNCATE
	if (abi >= 5)
		known |= 1ull << 15; // IOCTL_DEV
	attr.handled_access_fs = q->landlock_handled & known;
	int rs = syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
	if (rs < 0)
		fail(S_LANDLOCK, errno);
	rule.allowed_access = q->landlock_allowed & attr.handled_access_fs;
	rule.parent_fd = open("/", O_PATH | O_CLOEXEC);
	if (rule.parent_fd < 0)
		fail(S_LANDLOCK, errno);
	CHECK(syscall(SYS_landlock_add_rule, rs, 1 /* LANDLOCK_RULE_PATH_BENEATH */, &rule, 0), S_LANDLOCK);
	CHECK(syscall(SYS_landlock_restrict_self, rs, 0), S_LANDLOCK);
	close(rule.parent_fd);
	close(rs);
}

// apparmor asks the kernel to put the next exec under the sandbox's
// profile (what runc does for the init): written to this thread's own
// attribute, in the sandbox's procfs, which nothing in the sandbox can
// mount over (no CAP_SYS_ADMIN, and the profile denies mounts). Kernels
// before 5.8 have only the shared attr/exec.
static void apparmor(const char *profile) {
	int fd = open("/proc/thread-self/attr/apparmor/exec", O_WRONLY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		fd = open("/proc/thread-self/attr/exec", O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		fail(S_APPARMOR, errno);
	char cmd[256];
	int n = snprintf(cmd, sizeof cmd, "exec %s", profile);
	if (n >= (int)sizeof cmd)
		fail(S_APPARMOR, ENAMETOOLONG);
	if (write(fd, cmd, n) != n)
		fail(S_APPARMOR, errno);
	close(fd);
}

// env_path is the PATH of the command's environment (not ours).
static const char *env_path(char **env) {
	for (char **e = env; *e; e++)
		if (!strncmp(*e, "PATH=", 5))
			return *e + 5;
	return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
}

// run execs argv[0], looked up as a shell would: a name with a slash as
// is, else each PATH entry in turn. ENOENT if found nowhere, EACCES if only
// found not executable.
static void run(struct request *q) {
	if (q->exec_fd >= 0) {
		syscall(SYS_execveat, (int)q->exec_fd, "", q->argv, q->env, AT_EMPTY_PATH);
		fail(S_EXEC, errno);
	}
	const char *name = q->argv[0];
	if (strchr(name, '/')) {
		execve(name, q->argv, q->env);
		fail(S_EXEC, errno);
	}
	int seen_eacces = 0;
	const char *path = env_path(q->env);
	size_t nlen = strlen(name);
	for (const char *p = path;; p++) {
		const char *end = strchrnul(p, ':');
		size_t dlen = end - p;
		char *full = malloc(dlen + nlen + 2);
		if (!full)
			fail(S_EXEC, ENOMEM);
		memcpy(full, p, dlen);
		full[dlen] = '/';
		memcpy(full + dlen + 1, name, nlen + 1);
		execve(dlen ? full : name, q->argv, q->env);
		switch (errno) {
		case EACCES:
			seen_eacces = 1;
			// fall through
		case ENOENT:
		case ENOTDIR:
		case ESTALE:
		case ENODEV:
		case ETIMEDOUT:
			break;
		default:
			fail(S_EXEC, errno);
		}
		free(full);
		if (!*end)
			break;
		p = end;
	}
	fail(S_EXEC, seen_eacces ? EACCES : ENOENT);
}

static void child(struct request *q) {
	// Join the exec's cgroups before anything runs in the sandbox's name.
	for (uint64_t i = 0; i < q->ncgroups; i++)
		CHECK(write(q->cgroups[i], "0", 1), S_CGROUP);
	if (q->apparmor[0])
		apparmor(q->apparmor);
	// A best-effort sandbox's command runs under SCHED_IDLE, as its init
	// does (internal/qos); what it forks inherits it, and with RLIMIT_NICE
	// 0 and no CAP_SYS_NICE nothing in it can leave. Where the host has
	// core scheduling, it shares its init's cookie (pid 1 in the pid
	// namespace it is in), so it never shares a core with latency work.
	if (q->sched_idle) {
		struct sched_param sp = {0};
		CHECK(sched_setscheduler(0, SCHED_IDLE, &sp), S_SCHED);
	}
	if (q->core_share)
		CHECK(prctl(62 /* PR_SCHED_CORE */, 3 /* PR_SCHED_CORE_SHARE_FROM */, 1, 0 /* PIDTYPE_PID */, 0), S_SCHED);
	// A sandbox whose memory merges (its project's choice) runs its
	// commands opted into KSM as its init is (see main's "merge"); the
	// sandbox's own filter forbids it to opt itself in or out.
	if (q->memory_merge)
		CHECK(prctl(PR_SET_MEMORY_MERGE_, 1, 0, 0, 0), S_MERGE);

	// Rlimits while still root: raising a hard limit needs
	// CAP_SYS_RESOURCE.
	for (uint64_t i = 0; i < q->nrlimits; i++) {
		struct rlimit rl = {q->rlimits[i].soft, q->rlimits[i].hard};
		CHECK(setrlimit(q->rlimits[i].resource, &rl), S_RLIMIT);
	}
	CHECK(prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), S_CAPS);
	CHECK(setgroups(q->ngroups, q->groups), S_GROUPS);
	CHECK(setresgid(q->gid, q->gid, q->gid), S_GID);
	CHECK(setresuid(q->uid, q->uid, q->uid), S_UID);
	umask(q->umask);
	// The working directory is entered with the user's permissions, not
	// root's: setresuid to a non-root uid has cleared the effective set
	// (KEEPCAPS keeps the permitted one to finish with below).
	struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct data[2];
	CHECK(syscall(SYS_capget, &hdr, data), S_CAPS);
	if (chdir(q->cwd) < 0)
		fail(S_CWD, errno);
	data[0].effective = data[0].permitted;
	data[1].effective = data[1].permitted;
	CHECK(syscall(SYS_capset, &hdr, data), S_CAPS);

	// The bounding set first: dropping from it needs CAP_SETPCAP.
	for (int c = 0; c <= 63; c++) {
		if (q->cap_bounding & (1ull << c))
			continue;
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL)
			fail(S_CAPS, errno);
	}
	CHECK(prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), S_CAPS);
	data[0].effective = (uint32_t)q->cap_effective;
	data[1].effective = (uint32_t)(q->cap_effective >> 32);
	data[0].permitted = (uint32_t)q->cap_permitted;
	data[1].permitted = (uint32_t)(q->cap_permitted >> 32);
	data[0].inheritable = data[1].inheritable = 0;
	CHECK(syscall(SYS_capset, &hdr, data), S_CAPS);
	CHECK(prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0), S_CAPS);

	CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), S_NNP);
	if (q->landlock_handled)
		landlock(q);
	// Every descriptor but 0-2 (and the binary, needed by execveat) is
	// closed by the exec; errpipe is close-on-exec already.
	if (syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC) < 0) {
		for (int fd = 3; fd < 1024; fd++)
			if (fd != errpipe && fd != q->exec_fd)
				close(fd);
	}
	for (uint64_t i = 0; i < q->nfilters; i++)
		CHECK(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &q->filters[i]), S_SECCOMP);
	run(q);
}

// ---- the parent ---------------------------------------------------------------

int main(int argc, char **argv) {
	if (argc == 2 && !strcmp(argv[1], "hold")) {
		// The holder of a new user namespace the agent idmaps mounts
		// with (internal/backend/container/userns.go): lives until its
		// stdin closes.
		char c;
		while (read(0, &c, 1) > 0) {
		}
		return 0;
	}
	if (argc >= 3 && !strcmp(argv[1], "merge")) {
		// warren-enter merge PROG ARGS...: PROG (the runtime creating a
		// sandbox whose memory merges) and everything it forks and execs
		// (the sandbox's init, its workload) run opted into KSM: the
		// agent never is, and Go cannot set it between fork and exec.
		if (prctl(PR_SET_MEMORY_MERGE_, 1, 0, 0, 0) < 0) {
			fprintf(stderr, "warren-enter merge: prctl PR_SET_MEMORY_MERGE: %s\n", strerror(errno));
			return 125;
		}
		execv(argv[2], argv + 2);
		fprintf(stderr, "warren-enter merge: exec %s: %s\n", argv[2], strerror(errno));
		return 127;
	}
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	// Dies with the agent (its child, in the sandbox, lives on there like
	// any process the workload started).
	prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);

	struct request q;
	read_request(&q);

	// The sandbox's place in a host-wide OOM's kill order (before the
	// agent's), set on the host's /proc before joining the sandbox's, so
	// that the command inherits it. With CAP_SYS_RESOURCE it is also the
	// floor nothing in the sandbox can go below.
	{
		char v[24];
		int n = snprintf(v, sizeof v, "%lld", (long long)q.oom_score_adj);
		int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write(fd, v, n) != n)
			status("error oom_score_adj", errno);
		close(fd);
	}

	int ns = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP;
	if (q.userns)
		ns |= CLONE_NEWUSER;
	if (setns(PIDFD, ns) < 0)
		status("error setns", errno);

	int pipefd[2];
	if (pipe2(pipefd, O_CLOEXEC) < 0)
		status("error fork", errno);
	pid_t pid = fork();
	if (pid < 0)
		status("error fork", errno);
	if (pid == 0) {
		close(pipefd[0]);
		close(STATUS_FD);
		errpipe = pipefd[1];
		child(&q);
	}
	close(pipefd[1]);
	// Descriptors the child no longer needs from us: the sandbox's stdio
	// stays open in the child only, so the agent sees EOF when the
	// command's tree lets go of it.
	close(0);
	close(1);
	close(2);

	int rec[2];
	ssize_t n;
	do
		n = read(pipefd[0], rec, sizeof rec);
	while (n < 0 && errno == EINTR);
	int ws;
	while (waitpid(pid, &ws, 0) < 0)
		if (errno != EINTR)
			status("error wait", errno);
	if (n == sizeof rec && rec[0] > 0 && rec[0] < (int)(sizeof stages / sizeof *stages)) {
		char what[32];
		snprintf(what, sizeof what, "error %s", stages[rec[0]]);
		status(what, rec[1]);
	}
	if (WIFSIGNALED(ws))
		status("signal", WTERMSIG(ws));
	status("exit", WEXITSTATUS(ws));
}
