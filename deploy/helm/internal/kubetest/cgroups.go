package kubetest

import (
	"fmt"
	"os"
	"path/filepath"
)

// cgroupMount is where the machine's cgroup hierarchies are mounted.
const cgroupMount = "/sys/fs/cgroup"

// createCgroups creates the kubelet's cgroup root, which must exist before
// it starts: in the cgroup v2 tree, or in every cgroup v1 hierarchy (a
// cpuset child gets its parent's CPUs and memory nodes, without which no
// process may join it).
func createCgroups(name string) error {
	if _, err := os.Stat(filepath.Join(cgroupMount, "cgroup.controllers")); err == nil {
		return os.Mkdir(filepath.Join(cgroupMount, name), 0o755)
	}
	hierarchies, err := filepath.Glob(filepath.Join(cgroupMount, "*", "cgroup.procs"))
	if err != nil {
		return err
	}
	for _, procs := range hierarchies {
		parent := filepath.Dir(procs)
		dir := filepath.Join(parent, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return fmt.Errorf("kubetest: cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(parent, f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return fmt.Errorf("kubetest: cgroup %s: %w", dir, err)
				}
			}
		}
	}
	return nil
}

// removeCgroups removes the kubelet's cgroup root and what the kubelet left
// in it, deepest first, in the cgroup v2 tree and in every cgroup v1
// hierarchy. A cgroup that still holds a process stays.
func removeCgroups(name string) {
	roots, _ := filepath.Glob(filepath.Join(cgroupMount, "*", name))
	roots = append(roots, filepath.Join(cgroupMount, name))
	for _, root := range roots {
		var dirs []string
		_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
	}
}
