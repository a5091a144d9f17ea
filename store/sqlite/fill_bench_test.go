package sqlite_test

import (
	"context"
	"io"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/syncular/caddy-syncular/internal/storetest"
)

// BenchmarkSQLiteCopyBlobWAL is the disk tier's fill of a large blob from
// a WAL file: its CPU per fill, which a chunked read (each transaction
// walking the blob's overflow chain from the start again) makes grow with
// the square of the size.
func BenchmarkSQLiteCopyBlobWAL(b *testing.B) {
	for _, mib := range []int{8, 24, 64} {
		b.Run(itoaMiB(mib), func(b *testing.B) {
			seg := make([]byte, mib<<20)
			r := rand.New(rand.NewPCG(uint64(mib), 1))
			for i := range seg {
				seg[i] = byte(r.Uint32())
			}
			_, s, ids, _ := storetest.JournalStore(b, "wal", seg)
			b.SetBytes(int64(len(seg)))
			b.ResetTimer()
			for b.Loop() {
				if _, err := s.CopyBlob(context.Background(), idOf(ids[0]), io.Discard); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func itoaMiB(n int) string {
	return strconv.Itoa(n) + "MiB"
}
