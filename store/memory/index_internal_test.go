package memory

import (
	"github.com/retryd/retryd/engine"
)

// indexed returns the retry the retry index holds under id, or a
// not-found error.
func (s *Store) indexed(id string) (*engine.Retry, error) {
	ix, h := s.indexOf(id)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if r := ix.retries.get(h, id); r != nil {
		return r, nil
	}
	return nil, &engine.Error{Kind: engine.KindNotFound, Message: "no retry " + id}
}
