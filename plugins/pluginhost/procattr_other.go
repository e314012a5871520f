//go:build !linux

package pluginhost

import "os/exec"

// setProcAttr does nothing outside Linux: there is no parent-death signal;
// the plugin SDK's parent watch ends orphaned plugins.
func setProcAttr(*exec.Cmd, bool) {}

// killGroup does nothing outside Linux: the plugin has no group of its own.
func killGroup(int) {}
