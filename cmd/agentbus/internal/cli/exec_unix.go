//go:build unix

package cli

import (
	"os/exec"
	"syscall"
)

// ownProcessGroup runs cmd in a process group of its own and makes
// cancelling its context send SIGTERM to the whole group, so that what
// "sh -c" starts is stopped too.
func ownProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	}
}

// killProcessGroup kills what is left of cmd's process group.
func killProcessGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // ESRCH: nothing left
	}
}
