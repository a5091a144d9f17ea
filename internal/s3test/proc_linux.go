package s3test

import (
	"os/exec"
	"runtime"
	"syscall"
)

// startChild starts cmd so that the kernel kills it if the test binary dies
// without running its cleanups (a -timeout panic, SIGKILL). Pdeathsig fires
// when the forking thread exits, so the fork runs on a locked thread that is
// unlocked (not exited) afterwards.
func startChild(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd.Start()
}
