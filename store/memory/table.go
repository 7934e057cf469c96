package memory

import "hash/maphash"

// table is a hash set of *T, found by a string each element carries (a
// session's or a retry's id): open addressing with linear probing, one
// pointer and one tag byte per slot.
//
// It replaces map[string]*T for the store's two big indexes, sessions by id
// and retries by id, which hold an entry per pending chain: a Go map keeps
// a copy of the key's string header beside each pointer and grows to twice
// its size, about 50 bytes an entry at a million entries; this keeps the
// key only in the element and costs about 14 bytes an entry (9 bytes per
// slot, at most three quarters of the slots used).
//
// Hashes are maphash.String of the id with the store's seed. A table is
// not safe for concurrent use: its shard's lock guards it. It grows (and
// shrinks) all at once, rehashing every element under that lock, where a
// Go map grows a part at a time: with a million sessions over 64 shards a
// shard's table holds about 16 000, which rehash in about a millisecond,
// once per doubling.
type table[T any] struct {
	// tags[i] is 0 for an empty slot, else 0x80 | 7 bits of the element's
	// hash, so that most probes that miss never read the element.
	tags  []uint8
	slots []*T
	n     int
	key   func(*T) string
	seed  maphash.Seed
}

func newTable[T any](seed maphash.Seed, key func(*T) string) table[T] {
	return table[T]{key: key, seed: seed}
}

// The hash's low bits pick the shard (modulo shardCount, a power of two),
// so a slot is chosen by the bits above them and the tag by the top bits.
const tableShift = 6

func tagOf(h uint64) uint8 { return uint8(h>>57) | 0x80 }

func (t *table[T]) home(h uint64) uint64 { return (h >> tableShift) & uint64(len(t.slots)-1) }

// Len reports how many elements the table holds.
func (t *table[T]) Len() int { return t.n }

// get returns the element with id (whose hash is h), or nil.
func (t *table[T]) get(h uint64, id string) *T {
	if t.n == 0 {
		return nil
	}
	mask, tag := uint64(len(t.slots)-1), tagOf(h)
	for i := t.home(h); ; i = (i + 1) & mask {
		switch t.tags[i] {
		case 0:
			return nil
		case tag:
			if e := t.slots[i]; t.key(e) == id {
				return e
			}
		}
	}
}

// put adds e, whose id hashes to h, or replaces the element with its id.
func (t *table[T]) put(h uint64, e *T) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.resize(max(16, 2*len(t.slots)))
	}
	id := t.key(e)
	mask, tag := uint64(len(t.slots)-1), tagOf(h)
	for i := t.home(h); ; i = (i + 1) & mask {
		switch t.tags[i] {
		case 0:
			t.tags[i], t.slots[i] = tag, e
			t.n++
			return
		case tag:
			if t.key(t.slots[i]) == id {
				t.slots[i] = e
				return
			}
		}
	}
}

// remove deletes the element with id (whose hash is h), if present. The
// elements after it in its probe run shift back (no tombstones), and a
// table that became mostly empty shrinks.
func (t *table[T]) remove(h uint64, id string) {
	if t.n == 0 {
		return
	}
	mask, tag := uint64(len(t.slots)-1), tagOf(h)
	i := t.home(h)
	for ; ; i = (i + 1) & mask {
		if t.tags[i] == 0 {
			return
		}
		if t.tags[i] == tag && t.key(t.slots[i]) == id {
			break
		}
	}
	// Backward shift: move each later element of the run into the hole
	// unless its home lies cyclically after the hole.
	for j := (i + 1) & mask; t.tags[j] != 0; j = (j + 1) & mask {
		k := t.home(maphash.String(t.seed, t.key(t.slots[j])))
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			t.tags[i], t.slots[i] = t.tags[j], t.slots[j]
			i = j
		}
	}
	t.tags[i], t.slots[i] = 0, nil
	t.n--
	if len(t.slots) > 16 && t.n*8 < len(t.slots) {
		t.resize(len(t.slots) / 2)
	}
}

func (t *table[T]) resize(size int) {
	old, oldTags := t.slots, t.tags
	t.slots, t.tags, t.n = make([]*T, size), make([]uint8, size), 0
	for i, e := range old {
		if oldTags[i] != 0 {
			t.insertNew(maphash.String(t.seed, t.key(e)), oldTags[i], e)
		}
	}
}

// insertNew adds an element known to be absent, without growing.
func (t *table[T]) insertNew(h uint64, tag uint8, e *T) {
	mask := uint64(len(t.slots) - 1)
	i := t.home(h)
	for t.tags[i] != 0 {
		i = (i + 1) & mask
	}
	t.tags[i], t.slots[i] = tag, e
	t.n++
}

// all calls f for every element until f returns false. f must not change
// the table.
func (t *table[T]) all(f func(*T) bool) {
	for i, e := range t.slots {
		if t.tags[i] != 0 && !f(e) {
			return
		}
	}
}
