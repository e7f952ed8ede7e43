// warren-fninit: the launcher of FnCall containers and the pid 1 of each.
//
// Why C, in a Go code base: a FnCall container lives for one call, so what
// it costs to make and end one is paid on every call. Measured on the
// project's machines, a Go pid 1 spent ~5 ms of CPU per container (runtime
// start, its threads and page faults) where the kernel work of a container
// (clone into four new namespaces, tmpfs, overlay, /proc, /dev, the root
// switch, exit) is ~0.5 ms. So this program is a single-threaded launcher, a
// "zygote": the node agent starts it once, and it makes every container by
// clone(2) of itself, without an exec; the child builds the container and
// serves it. Policy stays in Go: the agent sends the root's layers, the
// cgroups, the seccomp program (assembled by internal/fncall) and every
// limit; this file only carries them out. The wire format is documented in
// internal/fncall/proto, which encodes what this file decodes.
//
// The launcher (fd 3: the agent's socket):
//   MAKE (+ the network namespace and the cgroup.procs files to join)
//   -> clone(NEWNS|NEWPID|NEWIPC|NEWUTS)
//   -> MADE (+ the container's socket and a pidfd); when a container's pid 1
//   has exited and been reaped (its whole pid namespace is gone by then),
//   EXITED. It exits when the agent's socket closes, and dies with the agent
//   (PDEATHSIG); its containers die with it.
//
// A container's pid 1 (fd 3: its own socket): joins its cgroups and network
// namespace, builds the root (overlay of the read-only layers over a
// size-capped tmpfs; fresh /proc, the agent's read-only /dev with the
// scratch's shm/ on /dev/shm, /tmp, the workdir),
// moves it onto / and chroots into it, sets its hostname, empties the capability bounding
// set, sets no_new_privs, loads the seccomp filter and answers READY. Then
// FILES (written under the workdir as the runs' uid) and RUN (fork, exec as
// the runs' uid with rlimits, output relayed under caps, wall limit, KILL
// from the agent; every other process killed and reaped after each run),
// each answered. It exits when its socket closes, and as the namespace's
// init takes every process of the container with it.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/filter.h>
#include <grp.h>
#include <sched.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// Message types; keep in step with internal/fncall/proto.
enum {
	MSG_MAKE = 'M',   // agent -> launcher
	MSG_MADE = 'm',   // launcher -> agent
	MSG_EXITED = 'x', // launcher -> agent
	MSG_FILES = 'F',  // agent -> container
	MSG_RUN = 'R',    // agent -> container
	MSG_KILL = 'K',   // agent -> container
	MSG_READY = 'r',  // container -> agent
	MSG_DONE = 'k',   // container -> agent: files written
	MSG_ERROR = 'e',  // container -> agent
	MSG_RESULT = 'o', // container -> agent
};

#define SOCK_FD 3
#define MAX_MSG (256u << 20)

static void die(const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	fputs("warren-fninit: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	_exit(1);
}

// ---- buffers and the wire format -------------------------------------------

// buf is a growable byte buffer; an allocation failure ends the process
// (the agent sees the socket close and counts the container as broken).
typedef struct {
	char *p;
	size_t len, cap;
} buf;

static void need(buf *b, size_t n) {
	if (b->len + n <= b->cap)
		return;
	size_t c = b->cap ? b->cap : 256;
	while (c < b->len + n)
		c *= 2;
	b->p = realloc(b->p, c);
	if (!b->p)
		die("out of memory");
	b->cap = c;
}

static void put(buf *b, const void *p, size_t n) {
	need(b, n);
	if (n)
		memcpy(b->p + b->len, p, n);
	b->len += n;
}

static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); } // little-endian hosts only
static void put_bytes(buf *b, const void *p, size_t n) {
	uint32_t l = n;
	put(b, &l, 4);
	put(b, p, n);
}
static void put_str(buf *b, const char *s) { put_bytes(b, s, s ? strlen(s) : 0); }

// msg starts a frame: 4 bytes of length (filled in by send_msg) and the type.
static void msg(buf *b, char type) {
	b->len = 0;
	need(b, 5);
	b->len = 4;
	b->p[4] = type;
	b->len = 5;
}

// reader walks a received frame's body; a short or malformed body sets bad.
typedef struct {
	const char *p;
	size_t left;
	int bad;
} reader;

static uint64_t get_u64(reader *r) {
	uint64_t v = 0;
	if (r->left < 8) {
		r->bad = 1;
		return 0;
	}
	memcpy(&v, r->p, 8);
	r->p += 8;
	r->left -= 8;
	return v;
}

// get_bytes returns a pointer into the frame and its length.
static const char *get_bytes(reader *r, size_t *n) {
	uint32_t l;
	if (r->left < 4) {
		r->bad = 1;
		*n = 0;
		return "";
	}
	memcpy(&l, r->p, 4);
	r->p += 4;
	r->left -= 4;
	if (l > r->left) {
		r->bad = 1;
		*n = 0;
		return "";
	}
	const char *p = r->p;
	r->p += l;
	r->left -= l;
	*n = l;
	return p;
}

// get_str returns a NUL-terminated copy (a string with a NUL inside is bad).
static char *get_str(reader *r) {
	size_t n;
	const char *p = get_bytes(r, &n);
	if (memchr(p, 0, n))
		r->bad = 1;
	char *s = malloc(n + 1);
	if (!s)
		die("out of memory");
	memcpy(s, p, n);
	s[n] = 0;
	return s;
}

// get_strs returns a NULL-terminated array of strings.
static char **get_strs(reader *r) {
	uint64_t n = get_u64(r);
	if (n > r->left) { // every item takes at least 4 bytes
		r->bad = 1;
		n = 0;
	}
	char **v = calloc(n + 1, sizeof(char *));
	if (!v)
		die("out of memory");
	for (uint64_t i = 0; i < n; i++)
		v[i] = get_str(r);
	return v;
}

static void free_strs(char **v) {
	if (!v)
		return;
	for (char **s = v; *s; s++)
		free(*s);
	free(v);
}

// send_msg writes the frame b with up to 3 file descriptors attached.
// Returns -1 when the peer is gone.
static int send_msg(int fd, buf *b, const int *fds, int nfds) {
	uint32_t l = b->len - 4;
	memcpy(b->p, &l, 4);
	size_t off = 0;
	while (off < b->len) {
		struct iovec iov = {b->p + off, b->len - off};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
		char cbuf[CMSG_SPACE(3 * sizeof(int))];
		if (off == 0 && nfds > 0) {
			memset(cbuf, 0, sizeof cbuf);
			mh.msg_control = cbuf;
			mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
			struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
			memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
		}
		ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		off += n;
	}
	return 0;
}

// recv_msg reads one frame into b (type at b->p[0], body after it) and the
// file descriptors attached to it, up to MAX_FDS, into fds (*nfds of them;
// any beyond are closed). Returns the type, 0 at the end of the stream, -1
// on a malformed frame.
#define MAX_FDS 8
static int recv_msg(int sock, buf *b, int *fds, int *nfds) {
	uint32_t l;
	size_t got = 0;
	*nfds = 0;
	while (got < 4) {
		struct iovec iov = {(char *)&l + got, 4 - got};
		char cbuf[CMSG_SPACE(MAX_FDS * sizeof(int))];
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
		ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			int k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (int i = 0; i < k; i++) {
				int fd;
				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
				if (*nfds < MAX_FDS)
					fds[(*nfds)++] = fd;
				else
					close(fd);
			}
		}
		got += n;
	}
	if (l == 0 || l > MAX_MSG)
		return -1;
	b->len = 0;
	need(b, l);
	while (b->len < l) {
		ssize_t n = read(sock, b->p + b->len, l - b->len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return 0;
		b->len += n;
	}
	return (unsigned char)b->p[0];
}

static void close_all(int *fds, int n) {
	for (int i = 0; i < n; i++)
		close(fds[i]);
}

static int reply_error(int sock, const char *fmt, ...) {
	char s[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s, sizeof s, fmt, ap);
	va_end(ap);
	buf b = {0};
	msg(&b, MSG_ERROR);
	put_str(&b, s);
	int r = send_msg(sock, &b, NULL, 0);
	free(b.p);
	return r;
}

// ---- small helpers ---------------------------------------------------------

static int64_t now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static char *join(const char *a, const char *b) {
	char *s;
	if (asprintf(&s, "%s/%s", a, b) < 0)
		die("out of memory");
	return s;
}

// ---- the container: setup --------------------------------------------------

// setup is what MAKE carries.
typedef struct {
	char *scratch, *hostname, *workdir, *dev, *apparmor;
	uint64_t scratch_bytes, uid, gid, readonly;
	char **lower;
	struct sock_filter *filter;
	size_t filter_len;
} setup_t;

static setup_t S;

#define CHECK(expr, what)                                                                                              \
	do {                                                                                                           \
		if ((expr) < 0) {                                                                                      \
			reply_error(SOCK_FD, "%s: %s", what, strerror(errno));                                          \
			_exit(1);                                                                                      \
		}                                                                                                      \
	} while (0)

// populate mounts /proc and /dev inside root (the current directory). /dev
// is the agent's template, read-only and the same for every container (its
// device nodes work on it; nothing can be created there), with the
// scratch's shm/ on /dev/shm: two bind mounts, no filesystem of its own to
// make and tear down per container.
static void populate(void) {
	const unsigned long nsd = MS_NOSUID | MS_NODEV | MS_NOEXEC;
	mkdir("proc", 0755);
	mkdir("dev", 0755);
	CHECK(mount("proc", "proc", "proc", nsd, "subset=pid,hidepid=invisible"), "mount /proc");
	CHECK(mount(S.dev, "dev", NULL, MS_BIND, NULL), "bind /dev");
	CHECK(mount("../shm", "dev/shm", NULL, MS_BIND, NULL), "bind /dev/shm");
}

// mkdirs makes path (relative to the current directory) and its parents.
static int mkdirs(const char *path, mode_t mode) {
	char p[PATH_MAX];
	if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) {
		errno = ENAMETOOLONG;
		return -1;
	}
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(p, mode) < 0 && errno != EEXIST)
			return -1;
		*s = '/';
	}
	if (mkdir(p, mode) < 0 && errno != EEXIST)
		return -1;
	return 0;
}

// build_root makes the container's root and moves into it (see the top).
// Every write of the container goes to one tmpfs, the scratch, capped at
// scratch_bytes and charged to the container's cgroup. Two shapes:
//
// read-only (one layer that has the mount points): the layer's own mount
// bound read-only, the scratch's tmp/ and box/ bound on /tmp and the
// workdir. Lookups hit the layer's dentries, warm from every container
// before this one, so a program starts as fast as on the host.
//
// overlay: the layers under an overlay whose upper dir is on the scratch;
// the program may write anywhere. Each overlay starts with no dentries, so
// every path a program looks up costs a lookup through the layers (~1 ms
// for a python start).
static void build_root(void) {
	char opts[8192], sz[64] = "";
	CHECK(mount("", "/", NULL, MS_REC | MS_PRIVATE, NULL), "make / private");
	if (S.scratch_bytes)
		snprintf(sz, sizeof sz, ",size=%llu", (unsigned long long)S.scratch_bytes);
	snprintf(opts, sizeof opts, "mode=0755%s", sz);
	CHECK(mount("tmpfs", S.scratch, "tmpfs", MS_NOSUID | MS_NODEV, opts), "mount scratch tmpfs");
	CHECK(chdir(S.scratch), "chdir scratch");
	CHECK(mkdir("root", 0755), "mkdir root");
	CHECK(mkdir("shm", 01777), "mkdir shm");
	CHECK(chmod("shm", 01777), "chmod shm"); // past the umask
	const char *wd = S.workdir + 1; // relative to the new root
	if (S.readonly) {
		CHECK(mkdir("tmp", 01777), "mkdir tmp");
		CHECK(chmod("tmp", 01777), "chmod tmp");
		CHECK(mkdir("box", 0755), "mkdir box");
		CHECK(chown("box", S.uid, S.gid), "chown workdir");
		CHECK(mount(S.lower[0], "root", NULL, MS_BIND, NULL), "bind root");
		CHECK(mount(NULL, "root", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL),
		      "remount root read-only");
		CHECK(mount("tmp", "root/tmp", NULL, MS_BIND, NULL), "bind /tmp");
		snprintf(opts, sizeof opts, "root/%s", wd);
		CHECK(mount("box", opts, NULL, MS_BIND, NULL), "bind workdir");
		CHECK(chdir("root"), "chdir root");
	} else {
		CHECK(mkdir("upper", 0755), "mkdir upper");
		CHECK(mkdir("work", 0755), "mkdir work");
		size_t n = snprintf(opts, sizeof opts, "lowerdir=");
		for (char **l = S.lower; *l && n < sizeof opts; l++)
			n += snprintf(opts + n, sizeof opts - n, "%s%s", l == S.lower ? "" : ":", *l);
		if (n < sizeof opts)
			n += snprintf(opts + n, sizeof opts - n, ",upperdir=%s/upper,workdir=%s/work", S.scratch,
				      S.scratch);
		if (n >= sizeof opts) {
			reply_error(SOCK_FD, "overlay options too long");
			_exit(1);
		}
		CHECK(mount("overlay", "root", "overlay", MS_NOSUID | MS_NODEV, opts), "mount overlay");
		CHECK(chdir("root"), "chdir root");
		mkdir("tmp", 01777);
		CHECK(chmod("tmp", 01777), "chmod /tmp");
		CHECK(mkdirs(wd, 0755), "make workdir");
		CHECK(chown(wd, S.uid, S.gid), "chown workdir");
	}
	populate();
	// The new root goes on top of / and becomes this process's root, like
	// switch_root, rather than by pivot_root: unmounting the old root
	// costs an expedited RCU grace period (IPIs to every CPU) per
	// container, ~0.5 ms of the machine's CPU per call measured. The host's
	// tree stays beneath, shadowed and unreachable: leaving a chroot needs
	// CAP_SYS_CHROOT, which nothing in the container has, and the seccomp
	// filter refuses chroot, mount and pivot_root anyway. It is not even
	// listed: /proc/self/mountinfo shows only what is under a process's
	// root.
	CHECK(mount(".", "/", NULL, MS_MOVE, NULL), "move root");
	CHECK(chroot("."), "chroot");
	CHECK(chdir("/"), "chdir /");
}

// drop_privileges empties the capability bounding set and sets
// no_new_privs. The launcher does it once at its start: both are inherited
// by every container it clones, and neither takes anything from the
// launcher or a container's pid 1 (root, with its capabilities, which only
// an execve could lose or gain): they only ensure that nothing a run
// executes can ever gain a capability, through file capabilities or setuid
// binaries.
static void drop_privileges(void) {
	for (int c = 0; c <= 63; c++)
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL)
			die("drop capability %d: %s", c, strerror(errno));
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		die("no_new_privs: %s", strerror(errno));
}

// apparmor asks the kernel to put every run under the AppArmor profile
// (where the host runs AppArmor): set on this process, in the container's
// fresh /proc, it passes to each forked run and applies at its exec.
static void apparmor(void) {
	if (!S.apparmor[0])
		return;
	int fd = open("/proc/thread-self/attr/apparmor/exec", O_WRONLY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		fd = open("/proc/thread-self/attr/exec", O_WRONLY | O_CLOEXEC);
	CHECK(fd, "apparmor");
	char cmd[256];
	int n = snprintf(cmd, sizeof cmd, "exec %s", S.apparmor);
	if (n >= (int)sizeof cmd)
		errno = ENAMETOOLONG, n = -1;
	else if (write(fd, cmd, n) != n)
		n = -1;
	CHECK(n, "apparmor");
	close(fd);
}

// confine loads the seccomp filter, last: it refuses the mounts above.
static void confine(void) {
	if (S.filter_len) {
		struct sock_fprog prog = {.len = S.filter_len, .filter = S.filter};
		CHECK(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog), "seccomp");
	}
}

// ---- the container: a run --------------------------------------------------

// capture keeps the first limit bytes of a stream (limit 0: all) and counts
// every byte.
typedef struct {
	int fd; // read end; -1 once closed
	buf kept;
	uint64_t total, limit;
} capture;

// pump reads what is there; returns 1 when the stream passed its cap.
static int pump(capture *c) {
	char tmp[65536];
	ssize_t n = read(c->fd, tmp, sizeof tmp);
	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return 0;
	if (n <= 0) {
		close(c->fd);
		c->fd = -1;
		return 0;
	}
	c->total += n;
	size_t room = n;
	if (c->limit) {
		uint64_t left = c->kept.len < c->limit ? c->limit - c->kept.len : 0;
		room = (uint64_t)n < left ? (size_t)n : left;
	}
	put(&c->kept, tmp, room);
	return c->limit && c->total > c->limit;
}

typedef struct {
	char **argv, **env;
	char *dir;
	const char *stdin_data;
	size_t stdin_len;
	uint64_t wall_ns, output_bytes, file_bytes, cpu_seconds, stack_bytes;
} run_t;

typedef struct {
	int64_t exit_code, sig;
	char start_error[512];
	capture out, err;
	char killed[64];
	int64_t wall_ns, cpu_ns, max_rss_kib;
} result_t;

// lookup finds name like execvp does in env's PATH; relative entries are
// against dir. Returns a malloc'd path or NULL.
static char *lookup(const char *name, char **env, const char *dir) {
	if (strchr(name, '/'))
		return strdup(name);
	const char *path = "/usr/local/bin:/usr/bin:/bin";
	for (char **e = env; *e; e++)
		if (!strncmp(*e, "PATH=", 5))
			path = *e + 5;
	char *copy = strdup(path), *save = NULL, *p = NULL;
	for (char *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
		char *cand = join(d, name);
		if (cand[0] != '/') {
			char *abs = join(dir, cand);
			free(cand);
			cand = abs;
		}
		struct stat st;
		if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111)) {
			p = cand;
			break;
		}
		free(cand);
	}
	free(copy);
	return p;
}

static void set_limit(int res, uint64_t v) {
	struct rlimit rl = {v, v};
	setrlimit(res, &rl);
}

// child_args is what child needs; child_stack its stack until the execve.
struct child_args {
	run_t *r;
	const char *path;
	int in, out, err, errpipe;
};
static char child_stack[64 << 10] __attribute__((aligned(16)));

// child is the run's process between clone and execve. It shares pid 1's
// memory: system calls only, nothing of pid 1's written but the errno it
// reports through errpipe.
static int child(void *arg) {
	struct child_args *a = arg;
	run_t *r = a->r;
	const char *path = a->path;
	int in = a->in, out = a->out, err = a->err, errpipe = a->errpipe;
	// No setsid: the run stays in the launcher's session (which the agent
	// started without a terminal), and so in its scheduler autogroup. A
	// session per run is an autogroup per run where autogroups are on: a
	// task group per container, like a cpu cgroup each (see fncall's
	// cgroup.go).
	dup2(in, 0);
	dup2(out, 1);
	dup2(err, 2);
	int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (fd >= 0) { // the OOM killer picks the run, never pid 1
		write(fd, "1000", 4);
		close(fd);
	}
	syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC);
	set_limit(RLIMIT_FSIZE, r->file_bytes ? r->file_bytes : RLIM_INFINITY);
	if (r->cpu_seconds) {
		struct rlimit rl = {r->cpu_seconds, r->cpu_seconds + 1};
		setrlimit(RLIMIT_CPU, &rl);
	}
	if (r->stack_bytes)
		set_limit(RLIMIT_STACK, r->stack_bytes);
	set_limit(RLIMIT_CORE, 0);
	sigset_t all;
	sigemptyset(&all);
	sigprocmask(SIG_SETMASK, &all, NULL);
	struct sigaction dfl = {.sa_handler = SIG_DFL};
	sigaction(SIGPIPE, &dfl, NULL); // not shared: no CLONE_SIGHAND
	int e = 0;
	if (setgroups(0, NULL) < 0 || setgid(S.gid) < 0 || setuid(S.uid) < 0)
		e = errno;
	else if (chdir(r->dir) < 0)
		e = errno;
	else {
		execve(path, r->argv, r->env);
		e = errno;
	}
	write(errpipe, &e, sizeof e);
	_exit(127);
	return 0;
}

// kill_all kills every process of the container but pid 1.
static void kill_all(result_t *res, const char *why) {
	if (why && !res->killed[0])
		snprintf(res->killed, sizeof res->killed, "%s", why);
	kill(-1, SIGKILL);
}

// do_run starts r and relays it to its end; see the top of the file.
static void do_run(run_t *r, result_t *res, int sigfd) {
	memset(res, 0, sizeof *res);
	res->out.fd = res->err.fd = -1;
	res->out.limit = res->err.limit = r->output_bytes;
	if (!r->argv[0]) {
		res->exit_code = 127;
		snprintf(res->start_error, sizeof res->start_error, "empty argv");
		return;
	}
	char *path = lookup(r->argv[0], r->env, r->dir);
	if (!path) {
		res->exit_code = 127;
		snprintf(res->start_error, sizeof res->start_error, "%s: command not found", r->argv[0]);
		return;
	}
	int in, outp[2], errp[2], ep[2];
	if (r->stdin_len) {
		// A memfd: the program reads it at its own pace, or not at all.
		in = memfd_create("stdin", MFD_CLOEXEC);
		for (size_t off = 0; in >= 0 && off < r->stdin_len;) {
			ssize_t n = write(in, r->stdin_data + off, r->stdin_len - off);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				if (n == 0)
					errno = EIO;
				close(in);
				in = -1;
			} else {
				off += n;
			}
		}
		if (in >= 0 && lseek(in, 0, SEEK_SET) < 0) {
			close(in);
			in = -1;
		}
	} else {
		in = open("/dev/null", O_RDONLY | O_CLOEXEC);
	}
	if (in < 0 || pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0 || pipe2(ep, O_CLOEXEC) < 0) {
		res->exit_code = 127;
		snprintf(res->start_error, sizeof res->start_error, "%s: %s", r->argv[0], strerror(errno));
		free(path);
		return;
	}
	int64_t start = now_ns();
	// The child shares pid 1's memory until its execve (CLONE_VM, and pid
	// 1 waits meanwhile: CLONE_VFORK), so no page tables are copied and
	// nothing is faulted back in afterwards.
	struct child_args a = {r, path, in, outp[1], errp[1], ep[1]};
	pid_t pid = clone(child, child_stack + sizeof child_stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &a);
	free(path);
	close(in);
	close(outp[1]);
	close(errp[1]);
	close(ep[1]);
	int e = 0;
	if (pid < 0)
		e = errno;
	else if (read(ep[0], &e, sizeof e) != sizeof e)
		e = 0; // exec closed the pipe: started
	close(ep[0]);
	if (e) {
		res->exit_code = e == ENOENT ? 127 : 126;
		snprintf(res->start_error, sizeof res->start_error, "%s: %s", r->argv[0], strerror(e));
		close(outp[0]);
		close(errp[0]);
		if (pid > 0)
			while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
				;
		return;
	}
	res->out.fd = outp[0];
	res->err.fd = errp[0];
	fcntl(outp[0], F_SETFL, O_NONBLOCK);
	fcntl(errp[0], F_SETFL, O_NONBLOCK);

	int exited = 0, reaped = 0, sock_open = 1;
	int status = 0;
	struct rusage ru = {0};
	buf in_msg = {0};
	while (!reaped || res->out.fd >= 0 || res->err.fd >= 0) {
		struct pollfd p[4] = {
		    {res->out.fd, POLLIN, 0},
		    {res->err.fd, POLLIN, 0},
		    {sigfd, POLLIN, 0},
		    {sock_open ? SOCK_FD : -1, POLLIN, 0},
		};
		int timeout = -1;
		if (!exited && r->wall_ns) {
			int64_t left = start + (int64_t)r->wall_ns - now_ns();
			if (left <= 0) {
				kill_all(res, "wall");
				timeout = 100;
			} else {
				timeout = (int)((left + 999999) / 1000000);
			}
		}
		if (poll(p, 4, timeout) < 0 && errno != EINTR)
			die("poll: %s", strerror(errno));
		if (p[0].revents && pump(&res->out))
			kill_all(res, "output");
		if (p[1].revents && pump(&res->err))
			kill_all(res, "output");
		if (p[2].revents) {
			struct signalfd_siginfo si;
			while (read(sigfd, &si, sizeof si) == sizeof si)
				;
			for (;;) {
				int s;
				struct rusage u;
				pid_t w = wait4(-1, &s, WNOHANG, &u);
				if (w > 0 && w == pid) {
					status = s;
					ru = u;
					res->wall_ns = now_ns() - start;
					exited = 1;
					// The run is over: nothing it started may
					// outlive it.
					kill(-1, SIGKILL);
				}
				if (w > 0)
					continue;
				if (w < 0 && errno == ECHILD && exited)
					reaped = 1;
				break;
			}
		}
		if (p[3].revents) {
			int fds[MAX_FDS], nfds, t = recv_msg(SOCK_FD, &in_msg, fds, &nfds);
			close_all(fds, nfds);
			if (t <= 0) { // the agent is gone: so is the container
				sock_open = 0;
				kill_all(res, "closed");
			} else if (t == MSG_KILL) {
				reader rd = {in_msg.p + 1, in_msg.len - 1, 0};
				char *why = get_str(&rd);
				kill_all(res, why[0] ? why : "killed");
				free(why);
			}
		}
	}
	free(in_msg.p);
	if (!sock_open)
		_exit(0);
	res->cpu_ns = (int64_t)ru.ru_utime.tv_sec * 1000000000 + ru.ru_utime.tv_usec * 1000 +
		      (int64_t)ru.ru_stime.tv_sec * 1000000000 + ru.ru_stime.tv_usec * 1000;
	res->max_rss_kib = ru.ru_maxrss;
	if (WIFEXITED(status)) {
		res->exit_code = WEXITSTATUS(status);
	} else if (WIFSIGNALED(status)) {
		res->sig = WTERMSIG(status);
		res->exit_code = 128 + res->sig;
	}
}

// do_files writes FILES under the workdir, owned by the runs' uid.
static const char *do_files(reader *rd) {
	static char err[512];
	uint64_t n = get_u64(rd);
	if (chdir(S.workdir) < 0) {
		snprintf(err, sizeof err, "workdir: %s", strerror(errno));
		return err;
	}
	for (uint64_t i = 0; i < n && !rd->bad; i++) {
		char *path = get_str(rd);
		uint64_t mode = get_u64(rd) & 0777;
		size_t len;
		const char *data = get_bytes(rd, &len);
		if (rd->bad)
			break;
		// Relative, no "." or ".." component, no empty one.
		int ok = path[0] && path[0] != '/';
		for (char *c = path; ok && *c;) {
			char *end = strchrnul(c, '/');
			size_t l = end - c;
			if (l == 0 || (l == 1 && c[0] == '.') || (l == 2 && c[0] == '.' && c[1] == '.'))
				ok = 0;
			c = *end ? end + 1 : end;
			if (*end && !*c)
				ok = 0; // trailing slash
		}
		if (!ok) {
			snprintf(err, sizeof err, "bad file path %.200s", path);
			free(path);
			return err;
		}
		if (!mode)
			mode = 0644;
		// Parents, owned by the runs' uid.
		for (char *s = strchr(path, '/'); s; s = strchr(s + 1, '/')) {
			*s = 0;
			if (mkdir(path, 0755) == 0)
				lchown(path, S.uid, S.gid);
			else if (errno != EEXIST) {
				snprintf(err, sizeof err, "mkdir %.200s: %s", path, strerror(errno));
				free(path);
				return err;
			}
			*s = '/';
		}
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode);
		int bad = fd < 0;
		for (size_t off = 0; !bad && off < len;) {
			ssize_t w = write(fd, data + off, len - off);
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				bad = 1;
			else
				off += w;
		}
		if (!bad && (fchmod(fd, mode) < 0 || fchown(fd, S.uid, S.gid) < 0))
			bad = 1;
		if (bad) {
			snprintf(err, sizeof err, "write %.200s: %s", path, strerror(errno));
			if (fd >= 0)
				close(fd);
			free(path);
			return err;
		}
		close(fd);
		free(path);
	}
	chdir("/");
	return rd->bad ? "malformed files message" : NULL;
}

static void send_result(result_t *res) {
	buf b = {0};
	msg(&b, MSG_RESULT);
	put_u64(&b, res->exit_code);
	put_u64(&b, res->sig);
	put_str(&b, res->start_error);
	put_bytes(&b, res->out.kept.p, res->out.kept.len);
	put_bytes(&b, res->err.kept.p, res->err.kept.len);
	put_u64(&b, res->out.total);
	put_u64(&b, res->err.total);
	put_str(&b, res->killed);
	put_u64(&b, res->wall_ns);
	put_u64(&b, res->cpu_ns);
	put_u64(&b, res->max_rss_kib);
	if (send_msg(SOCK_FD, &b, NULL, 0) < 0)
		_exit(0);
	free(b.p);
	free(res->out.kept.p);
	free(res->err.kept.p);
}

// container is pid 1's life, from the clone to its socket's end. fds are
// MAKE's: the network namespace, then the cgroup.procs files to join.
static void container(int sock, int *fds, int nfds) {
	// Die with the launcher. Had it died before this prctl, its end of
	// the socket is closed and the first read below ends the container.
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	// fd 3 is free (the launcher's socket was closed) and none of fds is
	// 3: they were received while it was open.
	if (dup2(sock, SOCK_FD) < 0)
		_exit(1);
	// Into the container's cgroups before anything of it is charged.
	for (int i = 1; i < nfds; i++)
		if (write(fds[i], "0", 1) != 1) {
			reply_error(SOCK_FD, "join cgroup: %s", strerror(errno));
			_exit(1);
		}
	// Its own cgroup namespace, rooted at the cgroup just joined:
	// /proc/self/cgroup says "/", not where the node keeps its boxes.
	CHECK(unshare(CLONE_NEWCGROUP), "new cgroup namespace");
	CHECK(setns(fds[0], CLONE_NEWNET), "join network namespace");
	syscall(SYS_close_range, SOCK_FD + 1, ~0U, 0);
	fcntl(SOCK_FD, F_SETFD, FD_CLOEXEC);
	umask(022);
	build_root();
	CHECK(sethostname(S.hostname, strlen(S.hostname)), "sethostname");
	apparmor();
	confine();

	// SIGCHLD through a signalfd; SIGPIPE never (the socket says EPIPE).
	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, NULL);
	int sigfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
	CHECK(sigfd, "signalfd");
	signal(SIGPIPE, SIG_IGN);

	buf b = {0};
	msg(&b, MSG_READY);
	if (send_msg(SOCK_FD, &b, NULL, 0) < 0)
		_exit(0);
	int ran = 0;
	for (;;) {
		int fds[MAX_FDS], nfds, t = recv_msg(SOCK_FD, &b, fds, &nfds);
		close_all(fds, nfds);
		if (t <= 0)
			_exit(t == 0 ? 0 : 1);
		reader rd = {b.p + 1, b.len - 1, 0};
		buf out = {0};
		switch (t) {
		case MSG_FILES: {
			const char *err = ran ? "files after a run" : do_files(&rd);
			if (err) {
				if (reply_error(SOCK_FD, "%s", err) < 0)
					_exit(0);
				break;
			}
			msg(&out, MSG_DONE);
			if (send_msg(SOCK_FD, &out, NULL, 0) < 0)
				_exit(0);
			break;
		}
		case MSG_RUN: {
			ran = 1;
			run_t r = {0};
			r.argv = get_strs(&rd);
			r.env = get_strs(&rd);
			r.dir = get_str(&rd);
			r.stdin_data = get_bytes(&rd, &r.stdin_len);
			r.wall_ns = get_u64(&rd);
			r.output_bytes = get_u64(&rd);
			r.file_bytes = get_u64(&rd);
			r.cpu_seconds = get_u64(&rd);
			r.stack_bytes = get_u64(&rd);
			if (rd.bad) {
				if (reply_error(SOCK_FD, "malformed run message") < 0)
					_exit(0);
			} else {
				result_t res;
				do_run(&r, &res, sigfd);
				send_result(&res);
			}
			free_strs(r.argv);
			free_strs(r.env);
			free(r.dir);
			break;
		}
		case MSG_KILL: // a kill that arrived after its run ended
			break;
		default:
			if (reply_error(SOCK_FD, "unexpected message %d", t) < 0)
				_exit(0);
		}
		free(out.p);
	}
}

// ---- the launcher ----------------------------------------------------------

static int parse_setup(reader *rd) {
	S.scratch = get_str(rd);
	S.scratch_bytes = get_u64(rd);
	S.hostname = get_str(rd);
	S.workdir = get_str(rd);
	S.uid = get_u64(rd);
	S.gid = get_u64(rd);
	S.readonly = get_u64(rd);
	S.lower = get_strs(rd);
	size_t n;
	const char *f = get_bytes(rd, &n);
	S.dev = get_str(rd);
	S.apparmor = get_str(rd);
	if (n % sizeof(struct sock_filter) || n / sizeof(struct sock_filter) > BPF_MAXINSNS)
		rd->bad = 1;
	S.filter_len = n / sizeof(struct sock_filter);
	S.filter = malloc(n + 1);
	if (!S.filter)
		die("out of memory");
	memcpy(S.filter, f, n);
	if (!rd->bad && (!S.lower[0] || S.workdir[0] != '/' || !S.scratch[0] || !S.dev[0]))
		rd->bad = 1;
	return rd->bad ? -1 : 0;
}

static void free_setup(void) {
	free(S.scratch);
	free(S.hostname);
	free(S.workdir);
	free(S.dev);
	free(S.apparmor);
	free_strs(S.lower);
	free(S.filter);
	memset(&S, 0, sizeof S);
}

// make_container clones one container and answers MADE. fds: the network
// namespace, then the cgroup.procs files the container joins.
static void make_container(int agent, reader *rd, int *fds, int nfds) {
	buf b = {0};
	msg(&b, MSG_MADE);
	int sv[2] = {-1, -1}, pidfd = -1;
	int64_t pid = -1, err = 0;
	if (nfds < 1 || parse_setup(rd) < 0)
		err = EINVAL;
	else if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		err = errno;
	else {
		pid = syscall(SYS_clone, CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_PIDFD | SIGCHLD,
			      0, &pidfd, 0, 0);
		if (pid == 0) {
			close(agent);
			close(sv[0]);
			container(sv[1], fds, nfds);
			_exit(0);
		}
		if (pid < 0)
			err = errno;
	}
	put_u64(&b, pid);
	put_u64(&b, err);
	int out[2] = {sv[0], pidfd};
	if (send_msg(agent, &b, out, err ? 0 : 2) < 0)
		_exit(0);
	free(b.p);
	for (int i = 0; i < 2; i++)
		if (sv[i] >= 0)
			close(sv[i]);
	if (pidfd >= 0)
		close(pidfd);
	close_all(fds, nfds);
	free_setup();
}

// reap reports every exited container.
static void reap(int agent) {
	for (;;) {
		int s;
		pid_t pid = waitpid(-1, &s, WNOHANG);
		if (pid <= 0)
			return;
		buf b = {0};
		msg(&b, MSG_EXITED);
		put_u64(&b, pid);
		put_u64(&b, s);
		if (send_msg(agent, &b, NULL, 0) < 0)
			_exit(0);
		free(b.p);
	}
}

// PROTO is the protocol's version (internal/fncall/proto.Version).
#define PROTO "proto=2"

int main(int argc, char **argv) {
	if (argc != 2 || strcmp(argv[1], PROTO)) {
		fprintf(stderr, "warren-fninit: this build speaks %s, the node agent %s: install the agent's own helpers (scripts/build-helpers)\n",
			PROTO, argc > 1 ? argv[1] : "proto=1");
		return 2;
	}
	int agent = SOCK_FD;
	struct stat st;
	if (fstat(agent, &st) < 0 || !S_ISSOCK(st.st_mode)) {
		fprintf(stderr, "warren-fninit: the node agent starts this with its socket on fd %d\n", SOCK_FD);
		return 2;
	}
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() == 1) // the agent died before the prctl
		return 1;
	drop_privileges();
	signal(SIGPIPE, SIG_IGN);
	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, NULL);
	int sigfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sigfd < 0)
		die("signalfd: %s", strerror(errno));
	fcntl(agent, F_SETFD, FD_CLOEXEC);
	buf b = {0};
	for (;;) {
		struct pollfd p[2] = {{agent, POLLIN, 0}, {sigfd, POLLIN, 0}};
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			die("poll: %s", strerror(errno));
		}
		if (p[1].revents) {
			struct signalfd_siginfo si;
			while (read(sigfd, &si, sizeof si) == sizeof si)
				;
			reap(agent);
		}
		if (p[0].revents) {
			int fds[MAX_FDS], nfds, t = recv_msg(agent, &b, fds, &nfds);
			if (t <= 0)
				return t == 0 ? 0 : 1; // the containers die with us
			reader rd = {b.p + 1, b.len - 1, 0};
			if (t == MSG_MAKE)
				make_container(agent, &rd, fds, nfds);
			else
				close_all(fds, nfds);
		}
	}
}
