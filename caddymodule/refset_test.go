package caddymodule

import (
	"sort"
	"testing"
)

func TestRefSetCountsUsers(t *testing.T) {
	var s refSet[string, int]
	members := func() []string {
		var out []string
		s.each(func(k string, v int) { out = append(out, k) })
		sort.Strings(out)
		return out
	}
	s.add("a", 1)
	s.add("a", 2) // a second handler of the same store
	s.add("b", 3)
	if got := members(); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("members %v, want [a b]: a shared member is reported once", got)
	}
	s.each(func(k string, v int) {
		if k == "a" && v != 1 {
			t.Errorf("a's value %d, want the first user's 1", v)
		}
	})
	s.remove("a")
	if got := members(); len(got) != 2 {
		t.Fatalf("after one of a's two users left: %v, want a still reported", got)
	}
	s.remove("a")
	s.remove("b")
	s.remove("c") // never added: no effect
	if got := members(); len(got) != 0 {
		t.Fatalf("after every user left: %v, want none", got)
	}
}
