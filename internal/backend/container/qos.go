package container

import (
	"fmt"
	"path"
	"path/filepath"

	"github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/qos"
)

// cgroupRel is sandbox id's cgroup path in every hierarchy:
// <CgroupParent>/<id>, or for a best-effort sandbox
// <CgroupParent>/best-effort/<id>, below the class's idle group
// (internal/qos).
func (c *Container) cgroupRel(id string, bestEffort bool) string {
	if bestEffort {
		return path.Join(c.cfg.CgroupParent, qos.ClassGroup, id)
	}
	return path.Join(c.cfg.CgroupParent, id)
}

// bestEffort puts a created best-effort sandbox into its class
// (internal/qos): the class's cgroup, its cgroup's parent, an idle group,
// and every thread in the sandbox's (the runtime's init, waiting to exec
// the sandbox's, or gVisor's sentry and gofer) under SCHED_IDLE, which
// whatever runs in the sandbox inherits; where the host has core
// scheduling, a cookie of its own for the init. Execs are put there by
// warren-enter (enterRequest.schedIdle).
func (c *Container) bestEffort(paths map[string]string, initPid int) error {
	d, ok := cpuCgroup(paths)
	if !ok {
		return fmt.Errorf("best-effort: no cpu cgroup among %v", paths)
	}
	class := cgroup.Dir{Path: filepath.Dir(d.Path), V2: d.V2}
	if filepath.Base(class.Path) != qos.ClassGroup {
		return fmt.Errorf("best-effort: cgroup %s is not in the class's group", d.Path)
	}
	if _, err := qos.SetGroupIdle(class); err != nil {
		return fmt.Errorf("best-effort: %w", err)
	}
	if err := qos.IdleTree(d); err != nil {
		return fmt.Errorf("best-effort: %w", err)
	}
	if c.qos.CoreScheduling == qos.CoreSchedulingOn {
		if err := qos.CoreCookie(initPid); err != nil {
			return fmt.Errorf("best-effort: %w", err)
		}
	}
	return nil
}

// cpuCgroup is the sandbox's cgroup that holds the cpu controller, from
// the paths the runtime recorded: v1's cpu hierarchy, or the unified one.
func cpuCgroup(paths map[string]string) (cgroup.Dir, bool) {
	if p, ok := paths["cpu"]; ok {
		return cgroup.Dir{Path: p}, true
	}
	if p, ok := paths[""]; ok {
		return cgroup.Dir{Path: p, V2: true}, true
	}
	return cgroup.Dir{}, false
}
