package redis

import (
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
)

// Notifications. A group commit publishes one message naming the sessions
// it changed, each as a length-prefixed string (protobuf's encoding of a
// bytes value without its tag), on the store's one channel: one PUBLISH
// per group instead of one per session. Every replica subscribes and wakes
// its local awaiters and watchers of those sessions.

// notice encodes the sessions a commit changed as a notification.
func notice(ids []string) string {
	var b []byte
	for _, id := range ids {
		b = protowire.AppendString(b, id)
	}
	return string(b)
}

// noticed returns the sessions a notification names (as many as decode).
func noticed(msg string) []string {
	b := []byte(msg)
	var ids []string
	for len(b) > 0 {
		id, n := protowire.ConsumeString(b)
		if n < 0 {
			break
		}
		ids = append(ids, id)
		b = b[n:]
	}
	return ids
}

// runNotifications fans the subscription's messages out to local awaiters
// and watchers.
func (s *Store) runNotifications() {
	defer s.wg.Done()
	for msg := range s.pubsub.Channel() {
		for _, id := range noticed(msg.Payload) {
			s.notify.wake(id)
		}
	}
}

// notifier wakes local waiters of a session (and every waiter of all
// sessions) when a replica changed it.
type notifier struct {
	mu       sync.Mutex
	sessions map[string]*waiters
	all      chan struct{}
}

type waiters struct {
	ch   chan struct{}
	refs int
}

func newNotifier() *notifier {
	return &notifier{sessions: map[string]*waiters{}, all: make(chan struct{})}
}

// watch returns a channel closed at the next change of the session (of any
// session when id is empty); call release once done with it.
func (n *notifier) watch(id string) (<-chan struct{}, func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if id == "" {
		return n.all, func() {}
	}
	w := n.sessions[id]
	if w == nil {
		w = &waiters{ch: make(chan struct{})}
		n.sessions[id] = w
	}
	w.refs++
	return w.ch, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if w.refs--; w.refs == 0 && n.sessions[id] == w {
			delete(n.sessions, id)
		}
	}
}

func (n *notifier) wake(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if w := n.sessions[id]; w != nil {
		close(w.ch)
		w.ch = make(chan struct{})
	}
	close(n.all)
	n.all = make(chan struct{})
}
