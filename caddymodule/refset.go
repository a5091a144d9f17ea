package caddymodule

import "sync"

// refSet is the set of live stores or disk tiers a scrape-time collector
// reports, counted by reference: each handler that uses one adds it at
// provision and removes it at cleanup, so one shared by several handlers
// (or kept across a reload) is reported once, and only while in use. The
// value is what the collector needs beside the key (e.g. the backend).
type refSet[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]*refEntry[V]
}

type refEntry[V any] struct {
	v    V
	refs int
}

// add counts one more user of k; the first one's v is kept.
func (s *refSet[K, V]) add(k K, v V) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.m[k]; e != nil {
		e.refs++
		return
	}
	if s.m == nil {
		s.m = map[K]*refEntry[V]{}
	}
	s.m[k] = &refEntry[V]{v: v, refs: 1}
}

// remove counts one user of k fewer, forgetting k after its last.
func (s *refSet[K, V]) remove(k K) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.m[k]; e != nil {
		if e.refs--; e.refs <= 0 {
			delete(s.m, k)
		}
	}
}

// each calls fn for every member, under the set's lock (fn must not add
// or remove).
func (s *refSet[K, V]) each(fn func(K, V)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, e := range s.m {
		fn(k, e.v)
	}
}
