package main

import (
	"bytes"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process control: the Caddy processes a scenario starts, stopped by
// cleanup when it ends (or when the run is interrupted).

var (
	procsMu sync.Mutex
	procs   []*proc
)

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// start runs bin with args and env added to this process's environment,
// its output in dir/<name>.log.
func start(name, bin string, args, env []string, dir string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	out, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	prog, argv := pinned(serverCPUs(), bin, args)
	cmd := exec.Command(prog, argv...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { _ = cmd.Wait(); close(p.done) }()
	procsMu.Lock()
	procs = append(procs, p)
	procsMu.Unlock()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// stop sends SIGTERM, then SIGKILL after 5 s, and waits.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// cleanup stops every process start started.
func cleanup() {
	procsMu.Lock()
	defer procsMu.Unlock()
	for _, p := range procs {
		p.stop()
	}
	procs = nil
}

// waitHTTP polls u until any HTTP answer comes back.
func waitHTTP(p *proc, u string) error {
	deadline := time.Now().Add(20 * time.Second)
	c := &http.Client{Timeout: time.Second, CheckRedirect: noRedirect}
	for {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %s", p.name, p.tail())
		default:
		}
		if resp, err := c.Get(u); err == nil {
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no answer on %s: %s", p.name, u, p.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// procCPU is the user+system CPU time of pid, in seconds.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("bad /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("bad /proc stat")
	}
	ut, _ := strconv.ParseFloat(f[11], 64) // utime, field 14
	st, _ := strconv.ParseFloat(f[12], 64) // stime, field 15
	return (ut + st) / clockTicks, nil
}

// clockTicks is USER_HZ, 100 on Linux.
const clockTicks = 100

// procStatus reads a kB field of /proc/<pid>/status.
func procStatus(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s not in /proc/%d/status", field, pid)
}

// serverCPUs and loadCPUs are the two halves of -pin ("" when unset).
func serverCPUs() string { s, _, _ := strings.Cut(*flagPin, ":"); return s }
func loadCPUs() string   { _, l, _ := strings.Cut(*flagPin, ":"); return l }

// pinned returns the command line that runs bin with args on cpus (a
// taskset -c list), or bin and args themselves when cpus is empty.
func pinned(cpus, bin string, args []string) (string, []string) {
	if cpus == "" {
		return bin, args
	}
	return "taskset", append([]string{"-c", cpus, bin}, args...)
}

// cpuCount is the number of CPUs in a taskset -c list ("0-1,4" is 3);
// 0 for an empty or malformed list.
func cpuCount(list string) int {
	n := 0
	for part := range strings.SplitSeq(list, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return 0
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0
			}
		}
		n += b - a + 1
	}
	return n
}

// pinSelf runs the bench itself again under taskset on the load CPUs when
// -pin is set: versitygw, the storm's client process and the bench's own
// client goroutines (the crowd scenarios, the checks) then stay off the
// server CPUs, as hey and vegeta do. Servers are started with their own
// taskset (start), which replaces the inherited affinity. It returns only
// when there is nothing to do (no -pin, or already pinned).
func pinSelf() error {
	const mark = "SYNCULAR_BENCH_PINNED"
	if loadCPUs() == "" || os.Getenv(mark) != "" {
		return nil
	}
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		return fmt.Errorf("-pin needs taskset: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	os.Setenv(mark, "1")
	return syscall.Exec(taskset, append([]string{"taskset", "-c", loadCPUs(), self}, os.Args[1:]...), os.Environ())
}
