package policy

import (
	"sync"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/proto"
)

// DefaultCacheSize is how many distinct inline policies a Cache made with
// NewCache(0) remembers.
const DefaultCacheSize = 1024

// Cache remembers resolved policies by their wire encoding, so that an
// agent sending the same inline policy with every report pays for
// resolving (validation, defaults, canonical key, the shared proto) once
// instead of per request. Two messages with the same encoding resolve to
// the same Policy, and a Policy is immutable, so sharing one is the same as
// resolving again; policies that encode differently but mean the same get
// separate entries with equal keys.
//
// It holds at most its size: once full, a policy it does not hold is
// resolved on every call and not added, so a client sending ever-new
// policies cannot grow it. Invalid policies are never cached. A Cache is
// safe for concurrent use.
type Cache struct {
	size int

	mu       sync.RWMutex
	resolved map[string]*Policy

	bufs sync.Pool // *[]byte, for encoding the lookup key
}

// NewCache returns an empty cache of at most size policies
// (DefaultCacheSize when size <= 0).
func NewCache(size int) *Cache {
	if size <= 0 {
		size = DefaultCacheSize
	}
	return &Cache{size: size, resolved: make(map[string]*Policy)}
}

// Resolve is Resolve(p), shared with every earlier call for a policy of the
// same encoding.
func (c *Cache) Resolve(p *retrydv1.RetryPolicy) (*Policy, error) {
	buf, _ := c.bufs.Get().(*[]byte)
	if buf == nil {
		buf = new([]byte)
	}
	defer c.bufs.Put(buf)
	key, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend((*buf)[:0], p)
	if err != nil {
		return Resolve(p)
	}
	*buf = key
	c.mu.RLock()
	hit := c.resolved[string(key)]
	c.mu.RUnlock()
	if hit != nil {
		return hit, nil
	}
	out, err := Resolve(p)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if prev := c.resolved[string(key)]; prev != nil {
		out = prev // resolved concurrently: keep one shared Policy
	} else if len(c.resolved) < c.size {
		c.resolved[string(key)] = out
	}
	c.mu.Unlock()
	return out, nil
}

// Len reports how many policies the cache holds.
func (c *Cache) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.resolved)
}
