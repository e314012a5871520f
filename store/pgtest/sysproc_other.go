//go:build !unix

package pgtest

import "syscall"

// sysProcAttr: only Unix runs the cluster as another user; elsewhere the
// cluster runs as this user (clusterOwner returns nil off root).
func sysProcAttr(*osUser, bool) *syscall.SysProcAttr { return nil }

// freeBytes: unknown off Unix.
func freeBytes(string) uint64 { return 0 }
