//go:build unix

package pgtest

import "syscall"

// sysProcAttr runs a child as owner (nil = this user) and, with newGroup, in
// its own process group so that a terminal ^C does not reach it.
func sysProcAttr(owner *osUser, newGroup bool) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setpgid: newGroup}
	if owner != nil {
		attr.Credential = &syscall.Credential{Uid: uint32(owner.uid), Gid: uint32(owner.gid)}
	}
	return attr
}

// freeBytes returns the space available to unprivileged users under dir,
// or 0 when it cannot tell.
func freeBytes(dir string) uint64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0
	}
	return st.Bavail * uint64(st.Bsize)
}
