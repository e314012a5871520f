package pluginhost

import (
	"os/exec"
	"syscall"
)

// setProcAttr asks the kernel to SIGKILL the plugin when the host dies
// (PR_SET_PDEATHSIG), unless disabled.
func setProcAttr(cmd *exec.Cmd, deathSignal bool) {
	if deathSignal {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
}
