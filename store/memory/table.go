package memory

// table is a hash set of *T, found by a string each element carries (a
// session's or a retry's id): open addressing with linear probing, one
// pointer and 32 bits of the element's hash per slot.
//
// It replaces map[string]*T for the store's two big indexes, sessions by id
// and retries by id, which hold an entry per pending chain: a Go map keeps
// a copy of the key's string header beside each pointer and grows to twice
// its size, about 50 bytes an entry at a million entries; this keeps the
// key only in the element and costs about 19 bytes an entry (12 bytes per
// slot, at most three quarters of the slots used).
//
// The slot's hash bits are what make removal cheap: removing an element
// moves the later elements of its probe run back, and each move needs the
// element's home slot. Read from the slot, that costs nothing; computed
// again, it cost a read of the element (a cache miss in a big index) and a
// hash of its id for every element of the run (BenchmarkTableChurn).
//
// Callers pass each id's hash (the store's maphash of it, whose low bits
// already chose the table's shard, see Store.shardOf): the table never
// hashes an id itself. A table is not safe for concurrent use: its shard's lock
// guards it. It grows (and shrinks) all at once, moving every element to
// its new slot under that lock (by the slots' hash bits, without reading
// the elements), where a Go map grows a part at a time: with a million
// sessions over 64 shards a shard's table holds about 16 000, all moved
// once per doubling.
type table[T any] struct {
	// hashes[i] is 0 for an empty slot, else the element's slotHash: its
	// low bits are the element's home, and a probe that misses reads the
	// element only when all 31 bits match.
	hashes []uint32
	slots  []*T
	n      int
	key    func(*T) string
}

func newTable[T any](key func(*T) string) table[T] {
	return table[T]{key: key}
}

// The hash's low bits pick the shard (modulo shardCount, a power of two),
// so a slot is chosen by the bits above them.
const tableShift = 6

// slotHash is what a slot keeps of hash h: 31 bits above the shard's, and
// the top bit set so that no element's is 0. A table has fewer than 2^31
// slots, so the low bits give the home slot.
func slotHash(h uint64) uint32 { return uint32(h>>tableShift) | 1<<31 }

func (t *table[T]) home(sh uint32) int { return int(sh) & (len(t.slots) - 1) }

// Len reports how many elements the table holds.
func (t *table[T]) Len() int { return t.n }

// get returns the element with id (whose hash is h), or nil.
func (t *table[T]) get(h uint64, id string) *T {
	if t.n == 0 {
		return nil
	}
	mask, sh := len(t.slots)-1, slotHash(h)
	for i := t.home(sh); ; i = (i + 1) & mask {
		switch t.hashes[i] {
		case 0:
			return nil
		case sh:
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
	mask, sh := len(t.slots)-1, slotHash(h)
	for i := t.home(sh); ; i = (i + 1) & mask {
		switch t.hashes[i] {
		case 0:
			t.hashes[i], t.slots[i] = sh, e
			t.n++
			return
		case sh:
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
	mask, sh := len(t.slots)-1, slotHash(h)
	i := t.home(sh)
	for ; ; i = (i + 1) & mask {
		if t.hashes[i] == 0 {
			return
		}
		if t.hashes[i] == sh && t.key(t.slots[i]) == id {
			break
		}
	}
	// Backward shift: move each later element of the run into the hole
	// unless its home lies cyclically after the hole.
	for j := (i + 1) & mask; t.hashes[j] != 0; j = (j + 1) & mask {
		k := t.home(t.hashes[j])
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			t.hashes[i], t.slots[i] = t.hashes[j], t.slots[j]
			i = j
		}
	}
	t.hashes[i], t.slots[i] = 0, nil
	t.n--
	if len(t.slots) > 16 && t.n*8 < len(t.slots) {
		t.resize(len(t.slots) / 2)
	}
}

func (t *table[T]) resize(size int) {
	old, oldHashes := t.slots, t.hashes
	t.slots, t.hashes, t.n = make([]*T, size), make([]uint32, size), 0
	for i, e := range old {
		if oldHashes[i] != 0 {
			t.insertNew(oldHashes[i], e)
		}
	}
}

// insertNew adds an element known to be absent, without growing.
func (t *table[T]) insertNew(sh uint32, e *T) {
	mask := len(t.slots) - 1
	i := t.home(sh)
	for t.hashes[i] != 0 {
		i = (i + 1) & mask
	}
	t.hashes[i], t.slots[i] = sh, e
	t.n++
}

// all calls f for every element until f returns false. f must not change
// the table.
func (t *table[T]) all(f func(*T) bool) {
	for i, e := range t.slots {
		if t.hashes[i] != 0 && !f(e) {
			return
		}
	}
}
