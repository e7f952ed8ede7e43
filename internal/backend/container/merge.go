package container

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/warrenhq/warren/internal/backend"
)

// Memory merging (KSM) of a project's sandboxes (backend.Spec.MemoryMerge).
//
// A process opts all its memory into KSM with prctl(PR_SET_MEMORY_MERGE),
// and what it forks and (since Linux 6.7) execs inherits it. The agent
// must not opt itself in, and Go cannot make the call between a child's
// fork and exec, so the runtime creating a merging sandbox is started
// through `warren-enter merge`, which opts itself in and execs it: the
// sandbox's init and workload inherit it. Its execs are opted in by
// warren-enter too (enterRequest.memoryMerge). No sandbox can opt itself
// in or out: its seccomp filter refuses madvise(MADV_MERGEABLE) and
// prctl(PR_SET_MEMORY_MERGE) (guard's deniedArgs). gVisor's sandboxes
// keep their memory in a shared file, which KSM does not merge: they run
// unmerged.

var _ backend.MemoryMerger = (*Container)(nil)

// MemoryMerge says whether the backend can merge sandboxes' memory here:
// the host has KSM, and a process opted in through warren-enter merge
// passes it on across exec. Probed once.
func (c *Container) MemoryMerge() error {
	c.mergeOnce.Do(func() { c.mergeErr = probeMerge(c.cfg.EnterPath) })
	return c.mergeErr
}

func probeMerge(enter string) error {
	if _, err := os.Stat("/sys/kernel/mm/ksm/run"); err != nil {
		return errors.New("the kernel has no KSM (CONFIG_KSM)")
	}
	cat, err := exec.LookPath("cat")
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	out, err := exec.Command(enter, "merge", cat, "/proc/self/ksm_stat").CombinedOutput()
	if err != nil {
		return fmt.Errorf("probe: warren-enter merge: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if !strings.Contains(string(out), "ksm_merge_any: yes") {
		return errors.New("the kernel does not keep prctl PR_SET_MEMORY_MERGE across exec (Linux 6.7+)")
	}
	return nil
}

// merges reports whether sandbox s's processes are opted into KSM.
func (c *Container) merges(s *sandbox) bool {
	return s.spec.MemoryMerge && !s.rt.gvisor() && c.MemoryMerge() == nil
}
