package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"
)

// Go's floor for (a): the least a Go net/http server does to answer the
// same 256 KiB, the bench binary itself run as a child with -floor: the
// file read into memory once, every request on any path answered 200 with
// Content-Length and the bytes in one Write. No token is checked, no
// header beyond those net/http adds: what the edge spends above it is its
// own work, and what nginx saves below it is Go's.

var (
	flagFloor     = flag.String("floor", "", "internal: serve this file's bytes as Go's floor (a child process of scenario (a))")
	flagFloorAddr = flag.String("floor-addr", "", "internal: the floor's listen address")
)

// floorServe is the child's whole work; it returns when the listener fails.
func floorServe(file, addr string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	length := strconv.Itoa(len(b))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			h := w.Header()
			h["Content-Type"] = []string{"application/octet-stream"}
			h["Content-Length"] = []string{length}
			w.Write(b)
		}),
	}
	return srv.Serve(ln)
}

// startFloor starts Go's floor serving file (on the server CPUs, like
// every server of the run) and returns it with its port.
func (e *env) startFloor(name, file string) (*proc, int, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, 0, err
	}
	port := freePort()
	p, err := start(name, self, []string{"-floor", file, "-floor-addr", fmt.Sprintf("127.0.0.1:%d", port)}, nil, e.dir)
	return p, port, err
}
