package pluginhost

import (
	"os/exec"
	"syscall"
)

// setProcAttr starts the plugin in a process group of its own, so that
// killGroup reaches what it forked, and asks the kernel to SIGKILL it when
// the host dies (PR_SET_PDEATHSIG), unless disabled.
func setProcAttr(cmd *exec.Cmd, deathSignal bool) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if deathSignal {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
}

// killGroup SIGKILLs the process group of the plugin whose pid is pid (its
// own: setProcAttr): a child it forked that holds its stdout would
// otherwise keep go-plugin waiting for the pipe's end for ever, and
// outlive the host (found in review: a registration hung for 11 minutes).
func killGroup(pid int) {
	if pid > 0 {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}
