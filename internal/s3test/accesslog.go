package s3test

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// Request is one line of the server's access log.
type Request struct {
	Bucket     string
	Operation  string // e.g. "s3_GetObject", "s3_HeadObject"
	Key        string
	RequestURI string
	Status     int
}

// Requests reads the access log: every request the server answered so far.
func (s *Server) Requests(t testing.TB) []Request {
	t.Helper()
	f, err := os.Open(s.AccessLog)
	if err != nil {
		t.Fatalf("s3test: access log: %v", err)
	}
	defer f.Close()
	var reqs []Request
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// owner bucket [dd/Month/yyyy:hh:mm:ss +zzzz] ip requester reqid op key uri status ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 11 || !strings.HasPrefix(fields[2], "[") {
			continue
		}
		status, _ := strconv.Atoi(fields[10])
		reqs = append(reqs, Request{
			Bucket:     fields[1],
			Operation:  fields[7],
			Key:        fields[8],
			RequestURI: fields[9],
			Status:     status,
		})
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("s3test: access log: %v", err)
	}
	return reqs
}

// CountRequests counts logged requests of operation op (e.g.
// "s3_GetObject"; "" for any) on object key (""for any).
func (s *Server) CountRequests(t testing.TB, op, key string) int {
	t.Helper()
	n := 0
	for _, r := range s.Requests(t) {
		if (op == "" || r.Operation == op) && (key == "" || r.Key == key) {
			n++
		}
	}
	return n
}
