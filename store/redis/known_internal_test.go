package redis

import (
	"fmt"
	"testing"
	"time"

	"github.com/retryd/retryd/engine"
)

// TestKnownForgetsTheOldest: past its bound, what a replica knows drops
// the keys it learned longest ago, never one of the last maxKnown/2: in a
// failure storm those are the sessions whose abandonment is next, and a
// session forgotten before it costs that transaction a conflict.
func TestKnownForgetsTheOldest(t *testing.T) {
	t.Parallel()
	k := newKnown()
	key := func(i int) string { return fmt.Sprintf("s:%d", i) }
	const n = 3 * maxKnown
	for i := range n {
		k.set(key(i), knownValue{raw: "v" + key(i)})
		if got := k.len(); got > maxKnown {
			t.Fatalf("after %d keys %d are known, more than maxKnown (%d)", i+1, got, maxKnown)
		}
	}
	for i := n - maxKnown/2; i < n; i++ {
		if got := k.get(key(i)).raw; got != "v"+key(i) {
			t.Fatalf("key %d of the last %d learned is known as %q", i, maxKnown/2, got)
		}
	}
	if got := k.get(key(0)).raw; got != "" {
		t.Errorf("the first key learned is still known (%q) after %d more", got, n-1)
	}
}

// TestKnownGenerations: a key found in the old generation moves to the
// young one when it is set again (a session written again stays known),
// and an absent value forgets the key in both.
func TestKnownGenerations(t *testing.T) {
	t.Parallel()
	k := newKnown()
	k.set("kept", knownValue{raw: "1"})
	k.set("gone", knownValue{raw: "1"})
	for i := range maxKnown / 2 { // "kept" and "gone" are now in the old generation
		k.set(fmt.Sprintf("fill:%d", i), knownValue{raw: "x"})
	}
	if _, ok := k.old["kept"]; !ok {
		t.Fatalf("after maxKnown/2 more keys, the first is not in the old generation")
	}
	k.set("kept", knownValue{raw: "2"})
	k.set("gone", knownValue{})
	for i := range maxKnown/2 - 1 { // the old generation is dropped
		k.set(fmt.Sprintf("more:%d", i), knownValue{raw: "x"})
	}
	if got := k.get("kept").raw; got != "2" {
		t.Errorf("a key set again while old is known as %q, want 2", got)
	}
	if v, ok := k.lookup("gone"); ok {
		t.Errorf("a key set absent is still known: %+v", v)
	}
	// take keeps the raw value and hands the session over once.
	sess := engine.NewSession("s", time.Now())
	k.set("with", knownValue{raw: "r", keptSession: keptSession{sess: sess}})
	if got := k.take("with"); got.sess != sess || got.raw != "r" {
		t.Errorf("take: %+v", got)
	}
	if got := k.take("with"); got.sess != nil || got.raw != "r" {
		t.Errorf("a second take: %+v, want the raw value without the session", got)
	}
}
