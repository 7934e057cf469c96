package memory

import (
	"crypto/rand"
	"hash/maphash"
	mrand "math/rand/v2"
	"strconv"
	"testing"
)

type tableItem struct{ id string }

// TestTableMatchesMap runs a random mix of puts, gets and removes (enough
// to grow, wrap around and shrink the table) against a map.
func TestTableMatchesMap(t *testing.T) {
	t.Parallel()
	seed := maphash.MakeSeed()
	tab := newTable(func(it *tableItem) string { return it.id })
	want := map[string]*tableItem{}
	rng := mrand.New(mrand.NewPCG(3, 4))
	hash := func(id string) uint64 { return maphash.String(seed, id) }
	for i := range 200_000 {
		id := strconv.Itoa(rng.IntN(5_000))
		if i > 100_000 { // the second half mostly removes: the table shrinks
			id = strconv.Itoa(rng.IntN(20_000))
		}
		switch op := rng.IntN(3); {
		case op == 0 || (op == 1 && i > 100_000):
			tab.remove(hash(id), id)
			delete(want, id)
		case op == 1:
			it := &tableItem{id: id}
			tab.put(hash(id), it)
			want[id] = it
		default:
			if got := tab.get(hash(id), id); got != want[id] {
				t.Fatalf("op %d: get(%s) = %v, want %v", i, id, got, want[id])
			}
		}
		if tab.Len() != len(want) {
			t.Fatalf("op %d: Len %d, want %d", i, tab.Len(), len(want))
		}
	}
	n := 0
	tab.all(func(it *tableItem) bool {
		if want[it.id] != it {
			t.Errorf("all: %s is not in the map", it.id)
		}
		n++
		return true
	})
	if n != len(want) {
		t.Errorf("all visited %d, want %d", n, len(want))
	}
	for id, it := range want {
		if tab.get(hash(id), id) != it {
			t.Errorf("get(%s) lost", id)
		}
	}
}

// BenchmarkTableChurn measures a table of retry-like entries under the
// retry index's use: an op removes the oldest entry and puts a new one,
// so the table stays at its size. Entries are separate objects the size of
// a retry, so a probe that reads one misses the cache as the index does.
func BenchmarkTableChurn(b *testing.B) {
	type entry struct {
		id  string
		pad [160]byte
	}
	for _, size := range []int{256, 16_384, 262_144} {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			seed := maphash.MakeSeed()
			tab := newTable(func(e *entry) string { return e.id })
			ring := make([]*entry, size)
			hash := func(id string) uint64 { return maphash.String(seed, id) }
			fresh := func() *entry { return &entry{id: rand.Text()} }
			for i := range ring {
				ring[i] = fresh()
				tab.put(hash(ring[i].id), ring[i])
			}
			i := 0
			for b.Loop() {
				old := ring[i]
				tab.remove(hash(old.id), old.id)
				ring[i] = fresh()
				tab.put(hash(ring[i].id), ring[i])
				i = (i + 1) % size
			}
		})
	}
}
