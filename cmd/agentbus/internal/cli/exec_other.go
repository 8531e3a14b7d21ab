//go:build !unix

package cli

import "os/exec"

// ownProcessGroup leaves cmd as it is: without process groups, cancelling
// its context kills the command itself only.
func ownProcessGroup(*exec.Cmd) {}

// killProcessGroup does nothing without process groups.
func killProcessGroup(*exec.Cmd) {}
