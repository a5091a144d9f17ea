//go:build !linux

package s3test

import "os/exec"

func startChild(cmd *exec.Cmd) error { return cmd.Start() }
