package sqlite_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/syncular/caddy-syncular/internal/storetest"
)

// BenchmarkSQLiteLookupGroup: one rollback-journal lookup with 0, 8 and
// 63 group ids (a commit before each, so none is answered from the
// snapshot). Each op includes the batch's 1 ms gather; the difference
// between the sizes is what the group adds to the read transaction,
// i.e. to the time the SHARED lock is held.
func BenchmarkSQLiteLookupGroup(b *testing.B) {
	const n = 64
	segs := storetest.SmallBlobs(n)
	w, s, ids, _ := storetest.JournalStore(b, "delete", segs...)
	if err := w.Exec("CREATE TABLE other (n INTEGER)"); err != nil {
		b.Fatal(err)
	}
	for _, k := range []int{0, 8, n - 1} {
		b.Run(fmt.Sprintf("also=%d", k), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				if err := w.Exec("INSERT INTO other VALUES (1)"); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				_, grp, err := s.LookupGroup(context.Background(), idOf(ids[0]), ids[1:1+k])
				if err != nil || len(grp) != k {
					b.Fatalf("%v, %d of %d", err, len(grp), k)
				}
			}
		})
	}
}
