package sqlite_test

import (
	"bufio"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The edge and the sync server are two processes, and what the edge does
// about a writer (awaitWriter, the lock-free record read's checks) reads
// the file's locks from /proc/locks or fcntl, where locks of its own
// process are not a writer's: a writer in the test process is invisible
// to awaitWriter. A test that needs the writer seen runs it as a process
// of its own: the test binary again, reading SQL statements from stdin.

const writerProcEnv = "SYNCULAR_TEST_SQL_WRITER"

func TestMain(m *testing.M) {
	if path := os.Getenv(writerProcEnv); path != "" {
		os.Exit(runWriterProc(path, os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// runWriterProc opens path as the reference sync server does (one
// connection, no busy timeout) and runs each line of in as a statement,
// answering "ok" or "err <message>" on a line of out.
func runWriterProc(path string, in io.Reader, out io.Writer) int {
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		fmt.Fprintln(out, "err", err)
		return 1
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		if _, err := db.Exec(sc.Text()); err != nil {
			fmt.Fprintln(out, "err", strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Fprintln(out, "ok")
		}
	}
	return 0
}

// writerProc is a writer process on one file.
type writerProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// startWriterProc starts a writer process on path; it ends with the test.
func startWriterProc(t *testing.T, path string) *writerProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), writerProcEnv+"="+path)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &writerProc{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(func() {
		in.Close()
		cmd.Wait()
	})
	return w
}

// exec runs one statement in the writer process and returns its error.
// Safe from one goroutine at a time.
func (w *writerProc) exec(stmt string) error {
	if _, err := fmt.Fprintln(w.in, stmt); err != nil {
		return err
	}
	if !w.out.Scan() {
		return fmt.Errorf("writer process: no answer (%v)", w.out.Err())
	}
	if line := w.out.Text(); line != "ok" {
		return fmt.Errorf("writer process: %s", strings.TrimPrefix(line, "err "))
	}
	return nil
}
